//! Host memory backing one guest region.

use std::io;
use std::ptr;

const GUARD: usize = 4096;

/// A shared mapping of a memfd named after the region (`/memfd:dram` in
/// /proc/PID/maps, as QEMU names its memfd backends), with a PROT_NONE guard
/// page on each side. Guards and the name keep each region its own VMA, and
/// the name lets tierd map a kvm-fd VM's memory to tiers from outside.
#[derive(Debug)]
pub(crate) struct HostMapping {
    reservation: *mut libc::c_void,
    hva: *mut u8,
    size: usize,
}

// SAFETY: the mapping is plain memory owned by this struct and freed only in
// Drop; all access through it is volatile and bounds-checked, and concurrent
// writers (the guest) never make those accesses unsound.
unsafe impl Send for HostMapping {}
// SAFETY: see Send; no method hands out references into the mapping.
unsafe impl Sync for HostMapping {}

impl HostMapping {
    pub(crate) fn new(size: usize, name: &str) -> io::Result<Self> {
        let cname = std::ffi::CString::new(name)
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        let total = size
            .checked_add(2 * GUARD)
            .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: a fresh anonymous mapping at a kernel-chosen address;
        // nothing else is affected. The result is checked below.
        let reservation = unsafe {
            libc::mmap(
                ptr::null_mut(),
                total,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if reservation == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let map = HostMapping {
            reservation,
            // SAFETY: GUARD < total, so the result is inside the reservation.
            hva: unsafe { reservation.cast::<u8>().add(GUARD) },
            size,
        };
        // SAFETY: memfd_create with a valid C string; the fd is checked and
        // closed below (the mapping keeps the file alive).
        let fd = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error()); // `map` unmaps on drop
        }
        // SAFETY: fd is our fresh memfd.
        let sized = unsafe { libc::ftruncate(fd, size as libc::off_t) };
        let mapped = if sized == 0 {
            // SAFETY: MAP_FIXED over [hva, hva+size), which lies inside our
            // own PROT_NONE reservation, so nothing else is replaced.
            unsafe {
                libc::mmap(
                    map.hva.cast(),
                    size,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_FIXED,
                    fd,
                    0,
                )
            }
        } else {
            libc::MAP_FAILED
        };
        let err = io::Error::last_os_error();
        // SAFETY: closing our own fd; the mapping holds its own reference.
        unsafe { libc::close(fd) };
        if mapped == libc::MAP_FAILED {
            return Err(err);
        }
        // 4 KiB pages so the host sees accesses per 4 KiB guest page.
        // SAFETY: advisory only, on our own mapping.
        if unsafe { libc::madvise(map.hva.cast(), size, libc::MADV_NOHUGEPAGE) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(map)
    }

    pub(crate) fn hva(&self) -> u64 {
        self.hva as u64
    }

    fn word_ptr(&self, offset: u64) -> Option<*mut u32> {
        let off = usize::try_from(offset).ok()?;
        if off % 4 != 0 || off.checked_add(4)? > self.size {
            return None;
        }
        // SAFETY: off+4 <= size, so the pointer stays inside the mapping.
        Some(unsafe { self.hva.add(off) }.cast::<u32>())
    }

    /// Volatile read: the guest may be writing the word concurrently.
    pub(crate) fn read_u32(&self, offset: u64) -> Option<u32> {
        let p = self.word_ptr(offset)?;
        // SAFETY: in bounds, 4-aligned (hva is page aligned), mapped RW.
        Some(unsafe { ptr::read_volatile(p) })
    }

    pub(crate) fn write_u32(&self, offset: u64, value: u32) -> Option<()> {
        let p = self.word_ptr(offset)?;
        // SAFETY: in bounds, 4-aligned, mapped RW; guest memory has no Rust
        // references into it, so a volatile store cannot alias one.
        unsafe { ptr::write_volatile(p, value) };
        Some(())
    }

    pub(crate) fn write_bytes(&self, offset: u64, bytes: &[u8]) -> Option<()> {
        let off = usize::try_from(offset).ok()?;
        if off.checked_add(bytes.len())? > self.size {
            return None;
        }
        for (i, b) in bytes.iter().enumerate() {
            // SAFETY: off + i < size, inside the RW mapping.
            unsafe { ptr::write_volatile(self.hva.add(off + i), *b) };
        }
        Some(())
    }
}

impl Drop for HostMapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the reservation made in `new`. No Rust
        // reference points into it (access is via raw pointers inside these
        // methods). DemoVm drops this after joining the vCPU and closing the
        // VM; even if a memslot outlived it, KVM_RUN would just fail (EFAULT).
        unsafe { libc::munmap(self.reservation, self.size + 2 * GUARD) };
    }
}
