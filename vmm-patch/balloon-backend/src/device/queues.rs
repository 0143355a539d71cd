//! Serving the queues: PFN chains to the engine, stats buffers held and
//! returned on the stats timer.

use super::*;

impl Balloon {
    pub(super) fn serve_queue(&self, index: usize, vring: &Vring) {
        let (role, mem, event_idx) = {
            let st = lock(&self.inner.state);
            let role = queue_role(index, st.acked_features, self.inner.specs.len());
            (role, st.mem.clone(), st.event_idx)
        };
        if role == QueueRole::Absent {
            return;
        }
        let Some(mem) = mem else {
            return;
        };
        loop {
            if event_idx && let Err(e) = vring.disable_notification() {
                tracing::warn!(queue = index, "disable_notification: {e}");
            }
            let mut used = false;
            loop {
                // Only the head comes from virtio-queue: its chain iterator
                // ends a looping or broken chain as if it were complete, so
                // the chain is walked by `crate::chain` instead.
                let popped = {
                    let mut v = vring.get_mut();
                    let q = v.get_queue_mut();
                    let (table, size) = (q.desc_table(), q.size());
                    q.pop_descriptor_chain(mem.memory())
                        .map(|c| (c.head_index(), table, size))
                };
                let Some((head, table, size)) = popped else {
                    break;
                };
                let guest = mem.memory();
                // The state lock is taken per chain, not for the whole drain:
                // a guest that keeps the queue full must not starve the
                // control socket (targets, state) for as long as it likes.
                let mut guard = lock(&self.inner.state);
                let st = &mut *guard;
                let walked =
                    st.walker
                        .walk(&*guest, GuestAddress(table), size, head, &mut st.descs);
                let hold = match role {
                    QueueRole::Stats => self.take_stats(st, head, walked, &guest, vring),
                    QueueRole::Tier { tier, op } => {
                        self.take_pfns(st, Some(tier), op, walked, &guest);
                        false
                    }
                    QueueRole::LegacyInflate => {
                        self.take_pfns(st, None, Op::Inflate, walked, &guest);
                        false
                    }
                    QueueRole::LegacyDeflate => {
                        self.take_pfns(st, None, Op::Deflate, walked, &guest);
                        false
                    }
                    QueueRole::Absent => false,
                };
                drop(guard);
                if !hold {
                    if let Err(e) = vring.add_used(head, 0) {
                        tracing::warn!(queue = index, "add_used: {e}");
                    }
                    used = true;
                }
            }
            if used {
                signal(vring, index);
            }
            if !event_idx {
                break;
            }
            match vring.enable_notification() {
                Ok(true) => continue,
                Ok(false) => break,
                Err(e) => {
                    tracing::warn!(queue = index, "enable_notification: {e}");
                    break;
                }
            }
        }
    }

    /// Reads a walked chain's readable bytes into `scratch`, at most `max`.
    fn gather(
        scratch: &mut Vec<u8>,
        walked: Result<(), ChainError>,
        descs: &[Descriptor],
        guest: &GuestMemoryMmap<()>,
        max: usize,
    ) -> Result<(), Gather> {
        scratch.clear();
        walked.map_err(Gather::Malformed)?;
        for desc in descs {
            if desc.is_write_only() {
                return Err(Gather::Bad(scratch.len()));
            }
            let len = desc.len() as usize;
            let start = scratch.len();
            if start + len > max {
                return Err(Gather::TooLong(start + len));
            }
            scratch.resize(start + len, 0);
            if guest
                .read_slice(&mut scratch[start..], desc.addr())
                .is_err()
            {
                return Err(Gather::Bad(start));
            }
        }
        Ok(())
    }

    fn take_pfns(
        &self,
        st: &mut State,
        tier: Option<usize>,
        op: Op,
        walked: Result<(), ChainError>,
        guest: &GuestMemoryMmap<()>,
    ) {
        let mut scratch = std::mem::take(&mut st.scratch);
        let gathered = Self::gather(&mut scratch, walked, &st.descs, guest, MAX_CHAIN_PFNS * 4);
        let malformed = match gathered {
            Err(Gather::Malformed(e)) => Some(e),
            _ => None,
        };
        let engine = &mut st.engine;
        let balloon = match tier {
            Some(t) => &mut engine.tiers[t],
            None => &mut engine.legacy,
        };
        let result = match gathered {
            Ok(()) => balloon.process_chain(op, &[&scratch], &mut SysReleaser::default()),
            Err(Gather::Bad(bytes)) => {
                Err(balloon.count_rejected(RejectReason::BadDescriptor, bytes / 4))
            }
            Err(Gather::TooLong(bytes)) => {
                Err(balloon.count_rejected(RejectReason::TooLong, bytes / 4))
            }
            // Nothing of a malformed chain is read: no PFN counted.
            Err(Gather::Malformed(_)) => {
                Err(balloon.count_rejected(RejectReason::BadDescriptor, 0))
            }
        };
        st.scratch = scratch;
        let queue = match tier {
            Some(t) => self.inner.specs[t].name.as_str(),
            None => "legacy",
        };
        match result {
            Ok(out) => {
                if out.errors > 0 {
                    tracing::warn!(queue, ?op, errors = out.errors, "release calls failed");
                }
            }
            Err(rej) => {
                st.rejections += 1;
                if st.rejections <= LOG_FIRST || st.rejections.is_multiple_of(1024) {
                    match malformed {
                        Some(e) => tracing::warn!(queue, ?op, total = st.rejections, "{rej}: {e}"),
                        None => tracing::warn!(queue, ?op, total = st.rejections, "{rej}"),
                    }
                }
            }
        }
    }

    /// Stores a stats buffer's entries; returns true if the device now
    /// holds the buffer (it is returned by the stats timer).
    fn take_stats(
        &self,
        st: &mut State,
        head: u16,
        walked: Result<(), ChainError>,
        guest: &GuestMemoryMmap<()>,
        vring: &Vring,
    ) -> bool {
        let mut scratch = std::mem::take(&mut st.scratch);
        let ok = Self::gather(&mut scratch, walked, &st.descs, guest, MAX_STATS_BYTES).is_ok();
        if ok {
            st.stats.values.extend(stats_entries(&scratch));
            st.stats.updates += 1;
        } else {
            st.stats.bad_buffers += 1;
        }
        st.scratch = scratch;
        if !ok {
            return false;
        }
        // A driver has one buffer out; if it posts another, give the old
        // one back rather than hold two.
        if let Some(old) = st.stats_held.replace(head)
            && let Err(e) = vring.add_used(old, 0)
        {
            tracing::warn!("stats add_used: {e}");
        }
        true
    }

    pub(super) fn stats_tick(&self, vrings: &[Vring]) {
        let mut st = lock(&self.inner.state);
        if let Some(t) = st.stats_timer.as_mut() {
            // Readable (epoll said so): consume the expirations.
            if let Err(e) = t.wait() {
                tracing::warn!("stats timer: {e}");
            }
        }
        let Some(head) = st.stats_held.take() else {
            return;
        };
        if let Some(v) = vrings.get(2) {
            if let Err(e) = v.add_used(head, 0) {
                tracing::warn!("stats add_used: {e}");
            }
            signal(v, 2);
        }
    }
}

fn signal(vring: &Vring, index: usize) {
    match vring.needs_notification() {
        Ok(false) => {}
        _ => {
            if let Err(e) = vring.signal_used_queue() {
                tracing::warn!(queue = index, "signal_used_queue: {e}");
            }
        }
    }
}

enum Gather {
    /// A device-writable or unreadable descriptor after this many bytes.
    Bad(usize),
    /// More than the limit (bytes announced so far).
    TooLong(usize),
    /// The chain itself is malformed (loops, leaves its table, ...).
    Malformed(ChainError),
}
