//! Receive double buffering (PM, seed 003 §3.2; `FEATURE_RX_DOUBLE_BUFFERING`,
//! `emp-nicd --rx-double-buffering`): the NIC's DMA writes into host memory
//! run on a DMA thread of their own, so the copy of one frame's payload into
//! the host overlaps the NIC CPUs taking in and handling the next. Payloads
//! go through two frame-sized buffers (PM's two: a third payload waits for
//! one); small writes (completion entries, their phase bytes) through a
//! bounded pool of small buffers, so they never hold a frame buffer.
//!
//! The control program sees the HAL contract unchanged, without waiting for
//! the DMA thread on the per-message path:
//! - a write whose address does not resolve fails at once (checked before
//!   it is queued);
//! - writes are applied in the order they were issued (one thread, FIFO,
//!   a release fence before each), which is what `dma_fence` promises: a
//!   completion's phase byte never becomes visible before the entry's body
//!   or the payload it reports, so a fence queues nothing and waits for
//!   nothing;
//! - an interrupt is queued behind the writes before it: the DMA thread
//!   raises it once they are in host memory, so a woken host finds its
//!   completion;
//! - a DMA read, and an admin completion (the host reads a saved context
//!   image as soon as it sees one), first wait for every queued write.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use crate::dma::DmaFault;
use crate::nic::NicShared;

/// Payload buffers: double buffering.
const BUFFERS: usize = 2;
/// Bytes of each payload buffer: one frame at the largest MTU. A longer
/// write (none on the receive path) is done in place after the queue drains.
const BUFFER_BYTES: usize = emp_uapi::wire::MTU_MAX as usize;
/// Small writes queued at most (completion entries and phase bytes of
/// about a window of messages).
const SMALL_BUFFERS: usize = 128;
/// Bytes of a small buffer: a completion entry, with room.
const SMALL_BYTES: usize = 256;
/// Interrupts queued at most beyond the writes (one per port is typical).
const INTERRUPTS: usize = 64;

/// One queued operation.
enum Job {
    /// `data` into host memory at `addr`; `small` says which pool it returns to.
    Write { addr: u64, data: Vec<u8>, small: bool },
    /// Raise interrupt `vector` (see [`NicShared::raise_interrupt`]).
    Interrupt(u16),
}

/// Jobs done, for the waiters of [`WriteBehind::drain`].
#[derive(Default)]
struct Progress {
    done: Mutex<u64>,
    cv: Condvar,
}

/// The DMA thread and its buffers.
pub struct WriteBehind {
    shared: Arc<NicShared>,
    jobs: Option<SyncSender<Job>>,
    free: Receiver<Vec<u8>>,
    free_small: Receiver<Vec<u8>>,
    progress: Arc<Progress>,
    issued: u64,
    thread: Option<JoinHandle<()>>,
    /// Writes that resolved when queued and faulted when done (their region
    /// was removed in between: a host deregistering memory it was receiving into).
    pub late_faults: Arc<AtomicU64>,
}

impl WriteBehind {
    /// Starts the DMA thread of `shared`'s NIC.
    pub fn start(shared: Arc<NicShared>) -> std::io::Result<WriteBehind> {
        let (jobs, job_rx) = sync_channel::<Job>(BUFFERS + SMALL_BUFFERS + INTERRUPTS);
        let (free_tx, free) = sync_channel::<Vec<u8>>(BUFFERS);
        let (small_tx, free_small) = sync_channel::<Vec<u8>>(SMALL_BUFFERS);
        for _ in 0..BUFFERS {
            free_tx.send(Vec::with_capacity(BUFFER_BYTES)).expect("room for every buffer");
        }
        for _ in 0..SMALL_BUFFERS {
            small_tx.send(Vec::with_capacity(SMALL_BYTES)).expect("room for every buffer");
        }
        let progress = Arc::new(Progress::default());
        let late_faults = Arc::new(AtomicU64::new(0));
        let (p, faults, s) = (progress.clone(), late_faults.clone(), shared.clone());
        let thread = std::thread::Builder::new().name(format!("emp-dma{}", shared.node)).spawn(move || {
            // Ends when the sender is dropped (the NIC's firmware stops).
            while let Ok(job) = job_rx.recv() {
                // Every write lands after the ones issued before it (a
                // completion's body, then its phase byte; a payload, then
                // the completion reporting it).
                std::sync::atomic::fence(Ordering::Release);
                match job {
                    Job::Write { addr, data, small } => {
                        if s.dma.read().expect("dma").write(addr, &data).is_err()
                            && faults.fetch_add(1, Ordering::Relaxed) == 0
                        {
                            tracing::warn!(node = s.node, addr, "DMA write to a region removed while queued");
                        }
                        // The NIC may already be gone (shutting down): the buffer goes with it.
                        let _ = if small { small_tx.send(data) } else { free_tx.send(data) };
                    }
                    Job::Interrupt(vector) => s.raise_interrupt(vector),
                }
                *p.done.lock().expect("progress") += 1;
                p.cv.notify_all();
            }
        })?;
        Ok(WriteBehind {
            shared,
            jobs: Some(jobs),
            free,
            free_small,
            progress,
            issued: 0,
            thread: Some(thread),
            late_faults,
        })
    }

    /// Queues `data` for host address `addr`; fails at once if it does not
    /// resolve. A payload waits for a free frame buffer (two in flight at
    /// most), a small write for a small one.
    pub fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), DmaFault> {
        self.shared.dma.read().expect("dma").check(addr, data.len())?;
        if data.len() > BUFFER_BYTES {
            self.drain();
            return self.shared.dma.read().expect("dma").write(addr, data);
        }
        let small = data.len() <= SMALL_BYTES;
        let free = if small { &self.free_small } else { &self.free };
        let Ok(mut buf) = free.recv() else {
            // The DMA thread is gone (it panicked): write in place.
            return self.shared.dma.read().expect("dma").write(addr, data);
        };
        buf.clear();
        buf.extend_from_slice(data);
        if let Err(e) = self.queue(Job::Write { addr, data: buf, small }) {
            let Job::Write { data, .. } = e else { unreachable!("a write was queued") };
            return self.shared.dma.read().expect("dma").write(addr, &data);
        }
        Ok(())
    }

    /// Raises interrupt `vector` once every write queued before it is in
    /// host memory.
    pub fn interrupt(&mut self, vector: u16) {
        if let Err(Job::Interrupt(v)) = self.queue(Job::Interrupt(vector)) {
            self.shared.raise_interrupt(v);
        }
    }

    /// Hands `job` to the DMA thread; gives it back if the thread is gone.
    fn queue(&mut self, job: Job) -> Result<(), Job> {
        let jobs = self.jobs.as_ref().expect("open until drop");
        jobs.send(job).map_err(|e| e.0)?;
        self.issued += 1;
        Ok(())
    }

    /// Waits until every queued write is in host memory (and every queued
    /// interrupt raised).
    pub fn drain(&mut self) {
        if self.thread.as_ref().is_none_or(|t| t.is_finished()) {
            return;
        }
        let mut done = self.progress.done.lock().expect("progress");
        while *done < self.issued {
            done = self.progress.cv.wait(done).expect("progress");
        }
    }
}

impl Drop for WriteBehind {
    fn drop(&mut self) {
        self.drain();
        // Closing the queue ends the thread.
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dma::{bus_addr, test_arena, SPACE_ARENA};
    use crate::nic::{power_on, NicConfig, SramBacking};
    use emp_uapi::sram::LayoutParams;

    /// A payload, then a one-byte "phase" written behind it, 300 times
    /// over: whoever looks at host memory never sees a phase whose payload
    /// has not landed, though the program never waited (no fence drains).
    #[test]
    fn writes_land_in_the_order_issued_without_the_program_waiting() {
        let cfg = NicConfig {
            node: 0,
            nodes: 1,
            mtu: 1500,
            features: 0,
            layout: LayoutParams { ports: 1, route_entries: 1, staging_size: 4096, ..LayoutParams::default() },
            fw: Default::default(),
            routes: crate::route::RouteTable::new(vec![]),
            cpus: 1,
        };
        let nic = power_on(&cfg, SramBacking::Memfd).expect("a NIC");
        nic.dma.write().unwrap().insert(1, test_arena(&[0u8; 16384]));
        let (payload, phase) = (bus_addr(SPACE_ARENA, 1, 0), bus_addr(SPACE_ARENA, 1, 12000));
        let watcher = {
            let nic = nic.clone();
            std::thread::spawn(move || {
                let (mut seen, mut looks) = (0u8, 0u64);
                while seen < 250 {
                    let (mut p, mut body) = ([0u8], [0u8; 9000]);
                    {
                        let dma = nic.dma.read().unwrap();
                        dma.read(phase, &mut p).unwrap();
                        dma.read(payload, &mut body).unwrap();
                    }
                    assert!(body.iter().all(|&b| b >= p[0]), "phase {} visible before its payload", p[0]);
                    seen = p[0];
                    looks += 1;
                }
                looks
            })
        };
        let mut w = WriteBehind::start(nic.clone()).expect("a DMA thread");
        for round in 1..=250u8 {
            w.write(payload, &vec![round; 9000]).unwrap();
            w.write(phase, &[round]).unwrap();
        }
        assert!(w.issued == 500, "every write queued, none done in place");
        w.drain();
        let mut last = [0u8];
        nic.dma.read().unwrap().read(phase, &mut last).unwrap();
        assert_eq!(last[0], 250, "drain waits for every write");
        assert!(watcher.join().expect("ordered") > 0);
        // A write that does not resolve fails at once, queuing nothing.
        assert!(w.write(bus_addr(SPACE_ARENA, 2, 0), &[1]).is_err());
        assert_eq!(w.issued, 500);
    }
}
