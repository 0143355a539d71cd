//! Opening, configuring, loading and attaching `ept.bpf.o`; running its
//! programs through BPF_PROG_TEST_RUN.

use std::mem::{ManuallyDrop, MaybeUninit};
use std::os::fd::{AsFd, AsRawFd};
use std::ptr::NonNull;

use libbpf_rs::skel::{OpenSkel, SkelBuilder};
use libbpf_rs::{OpenObject, ProgramInput};

use super::counts::RunStats;
use super::error::describe;
use super::{EptError, EptOptions, EptProgram, EptPrograms, MAX_VMS, VmCounts, heat, map_err};
use crate::bpf::ept::{EptSkel, EptSkelBuilder, OpenEptSkel};

/// State of one program after [`EptPrograms::load`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProgramStatus {
    /// Not asked for in [`EptOptions`].
    NotRequested,
    /// Loaded; not attached (`attach: false`, or the empty baseline).
    Loaded,
    /// Loaded and attached to its hook.
    Attached,
    /// Refused by the kernel, at load or attach.
    Failed(EptError),
}

impl Drop for EptPrograms {
    fn drop(&mut self) {
        self.links.clear();
        // SAFETY: dropped once, here; nothing uses the skeleton afterwards.
        unsafe { ManuallyDrop::drop(&mut self.skel) };
        // SAFETY: `storage` came from Box::into_raw in `load_object` and the
        // skeleton that borrowed it is gone.
        drop(unsafe { Box::from_raw(self.storage.as_ptr()) });
    }
}

/// Heat slots to hand out: none when the histogram is off (the map then
/// has one unused entry).
fn heat_capacity(options: &EptOptions) -> u32 {
    if options.heat {
        options.heat_entries.max(1)
    } else {
        0
    }
}

/// Opens the skeleton with `programs` set to autoload, applies the options
/// and loads it. On success the returned storage must outlive the skeleton.
fn load_object(
    options: &EptOptions,
    programs: &[EptProgram],
) -> Result<(NonNull<MaybeUninit<OpenObject>>, EptSkel<'static>), EptError> {
    let raw = Box::into_raw(Box::new(MaybeUninit::<OpenObject>::uninit()));
    // SAFETY: `raw` is a fresh allocation; the only reference made from it
    // is handed to the skeleton, and the allocation is freed either below
    // (after the failed skeleton is dropped) or in EptPrograms::drop (after
    // the skeleton is dropped).
    let storage: &'static mut MaybeUninit<OpenObject> = unsafe { &mut *raw };
    let result = open_configure_load(storage, options, programs);
    match result {
        Ok(skel) => {
            // SAFETY: Box::into_raw never returns null.
            Ok((unsafe { NonNull::new_unchecked(raw) }, skel))
        }
        Err(e) => {
            // SAFETY: the skeleton that borrowed `raw` was dropped inside
            // open_configure_load when it failed.
            drop(unsafe { Box::from_raw(raw) });
            Err(e)
        }
    }
}

fn open_configure_load(
    storage: &'static mut MaybeUninit<OpenObject>,
    options: &EptOptions,
    programs: &[EptProgram],
) -> Result<EptSkel<'static>, EptError> {
    let mut open: OpenEptSkel<'static> =
        EptSkelBuilder::default()
            .open(storage)
            .map_err(|e| EptError::Open {
                message: format!("{e:#}"),
            })?;
    let on = |p| programs.contains(&p);
    open.progs
        .ept_spte_changed
        .set_autoload(on(EptProgram::SpteChanged));
    open.progs
        .ept_fexit_age_gfn
        .set_autoload(on(EptProgram::FexitAgeGfn));
    open.progs
        .ept_age_test
        .set_autoload(on(EptProgram::AgeTest));
    open.progs.raw_tp_empty.set_autoload(on(EptProgram::Empty));
    configure(&mut open, options)?;
    open.load().map_err(|e| {
        let (errno, message) = describe(&e);
        match programs {
            [one] => EptError::Load {
                program: *one,
                errno,
                message,
            },
            [] => EptError::Object {
                programs: "maps only".into(),
                errno,
                message,
            },
            _ => EptError::Object {
                programs: programs
                    .iter()
                    .map(|p| p.name())
                    .collect::<Vec<_>>()
                    .join(", "),
                errno,
                message,
            },
        }
    })
}

/// Applies `options` to an opened `ept.bpf.o` (heat map size, `.rodata`
/// constants), as [`EptPrograms::load`] does before loading.
pub(crate) fn configure(open: &mut OpenEptSkel<'_>, options: &EptOptions) -> Result<(), EptError> {
    open.maps
        .heat
        .set_max_entries(heat_capacity(options).max(1))
        .map_err(map_err("heat", "set_max_entries"))?;
    let rodata = open.maps.rodata_data.as_deref_mut().ok_or(EptError::Open {
        message: "no .rodata in ept.bpf.o".into(),
    })?;
    rodata.heat_enabled = options.heat;
    rodata.accessed_mask = options.masks.accessed;
    rodata.acc_track_mask = options.masks.access_track;
    Ok(())
}

impl EptPrograms {
    /// Loads the requested programs and attaches those that load (when
    /// `options.attach`). A program the kernel refuses does not stop the
    /// others: each is then tried alone to find out which one, and why
    /// ([`EptPrograms::status`]). Errors only when the object itself (its
    /// maps) cannot be loaded.
    pub fn load(options: &EptOptions) -> Result<EptPrograms, EptError> {
        let requested = options.requested();
        let mut status: [ProgramStatus; 4] = std::array::from_fn(|_| ProgramStatus::NotRequested);
        let loaded = match load_object(options, &requested) {
            Ok(loaded) => {
                for p in &requested {
                    status[p.index()] = ProgramStatus::Loaded;
                }
                loaded
            }
            Err(e @ EptError::Open { .. }) => return Err(e),
            Err(only @ EptError::Load { .. }) => {
                // One program requested, and refused.
                if let [p] = requested.as_slice() {
                    status[p.index()] = ProgramStatus::Failed(only);
                }
                load_object(options, &[])?
            }
            Err(first) => {
                // Which one was refused: try each alone.
                let mut good = Vec::new();
                for p in &requested {
                    match load_object(options, std::slice::from_ref(p)) {
                        Ok(one) => {
                            drop(Self::from_parts(one, options, status.clone()));
                            good.push(*p);
                            status[p.index()] = ProgramStatus::Loaded;
                        }
                        Err(e) => status[p.index()] = ProgramStatus::Failed(e),
                    }
                }
                if good.len() == requested.len() {
                    // Each loads alone but not together: report that.
                    return Err(first);
                }
                load_object(options, &good)?
            }
        };
        let mut progs = Self::from_parts(loaded, options, status);
        if options.attach {
            progs.attach_loaded();
        }
        Ok(progs)
    }

    fn from_parts(
        (storage, skel): (NonNull<MaybeUninit<OpenObject>>, EptSkel<'static>),
        options: &EptOptions,
        status: [ProgramStatus; 4],
    ) -> EptPrograms {
        EptPrograms {
            links: Vec::new(),
            skel: ManuallyDrop::new(skel),
            storage,
            status,
            options: *options,
            taken: vec![VmCounts::default(); MAX_VMS as usize],
            heat: heat::HeatSlots::new(heat_capacity(options), MAX_VMS as usize),
        }
    }

    fn attach_loaded(&mut self) {
        for p in [EptProgram::SpteChanged, EptProgram::FexitAgeGfn] {
            if self.status[p.index()] != ProgramStatus::Loaded {
                continue;
            }
            let progs = &self.skel.progs;
            let prog = match p {
                EptProgram::SpteChanged => &progs.ept_spte_changed,
                EptProgram::FexitAgeGfn => &progs.ept_fexit_age_gfn,
                EptProgram::AgeTest | EptProgram::Empty => continue,
            };
            self.status[p.index()] = match prog.attach() {
                Ok(link) => {
                    self.links.push(link);
                    ProgramStatus::Attached
                }
                Err(e) => {
                    let (errno, message) = describe(&e);
                    ProgramStatus::Failed(EptError::Attach {
                        program: p,
                        errno,
                        message,
                    })
                }
            };
        }
    }

    /// The options it was loaded with.
    pub fn options(&self) -> &EptOptions {
        &self.options
    }

    /// What happened to `program`.
    pub fn status(&self, program: EptProgram) -> &ProgramStatus {
        &self.status[program.index()]
    }

    /// Every program with its status, in [`EptProgram::ALL`] order.
    pub fn statuses(&self) -> Vec<(EptProgram, &ProgramStatus)> {
        EptProgram::ALL
            .into_iter()
            .map(|p| (p, self.status(p)))
            .collect()
    }

    fn prog(&self, program: EptProgram) -> Result<&libbpf_rs::ProgramMut<'static>, EptError> {
        match self.status(program) {
            ProgramStatus::Loaded | ProgramStatus::Attached => {}
            _ => return Err(EptError::NotLoaded { program }),
        }
        let progs = &self.skel.progs;
        Ok(match program {
            EptProgram::SpteChanged => &progs.ept_spte_changed,
            EptProgram::FexitAgeGfn => &progs.ept_fexit_age_gfn,
            EptProgram::AgeTest => &progs.ept_age_test,
            EptProgram::Empty => &progs.raw_tp_empty,
        })
    }

    /// Runs a loaded raw_tp program once through BPF_PROG_TEST_RUN on the
    /// calling thread's CPU, with `args` as the tracepoint arguments (one
    /// u64 each; for `kvm_tdp_mmu_spte_changed`: as_id, gfn, level,
    /// old_spte, new_spte; for `ept_age_test`: tid, kvm, as_id, start,
    /// end, young). Returns the program's return value.
    pub fn test_run(&self, program: EptProgram, args: &[u64]) -> Result<u32, EptError> {
        self.test_run_repeat(program, args, 0).map(|(ret, _)| ret)
    }

    /// [`EptPrograms::test_run`] with the kernel's own timing loop: `repeat`
    /// runs and their mean duration. Raw tracepoint programs do not support
    /// it (the kernel answers EINVAL to any `repeat` other than 0; see the
    /// bpf-cost bench, which uses [`EptPrograms::run_stats`] instead).
    pub fn test_run_repeat(
        &self,
        program: EptProgram,
        args: &[u64],
        repeat: u32,
    ) -> Result<(u32, std::time::Duration), EptError> {
        let prog = self.prog(program)?;
        let mut ctx: Vec<u8> = args.iter().flat_map(|a| a.to_ne_bytes()).collect();
        let input = ProgramInput {
            context_in: Some(&mut ctx),
            repeat,
            ..ProgramInput::default()
        };
        prog.test_run(input)
            .map(|out| (out.return_value, out.duration))
            .map_err(|e| {
                let (errno, message) = describe(&e);
                EptError::TestRun {
                    program,
                    errno,
                    message,
                }
            })
    }

    /// In-kernel run count and time of `program` (counted only while
    /// [`enable_run_stats`] is on).
    pub fn run_stats(&self, program: EptProgram) -> Result<RunStats, EptError> {
        let prog = self.prog(program)?;
        let mut info = libbpf_rs::libbpf_sys::bpf_prog_info::default();
        let mut len = std::mem::size_of_val(&info) as u32;
        // SAFETY: `info` and `len` are valid for writes and `len` is the
        // size of `info`; the fd is the program's, alive for the call.
        let rc = unsafe {
            libbpf_rs::libbpf_sys::bpf_prog_get_info_by_fd(
                prog.as_fd().as_raw_fd(),
                &mut info,
                &mut len,
            )
        };
        if rc != 0 {
            return Err(EptError::Os {
                what: "bpf_prog_get_info_by_fd",
                message: std::io::Error::from_raw_os_error(-rc).to_string(),
            });
        }
        Ok(RunStats {
            run_cnt: info.run_cnt,
            run_time_ns: info.run_time_ns,
        })
    }
}
