//! Receive double buffering (PM, seed 003 §3.2; `FEATURE_RX_DOUBLE_BUFFERING`,
//! `emp-nicd --rx-double-buffering`): the NIC's DMA writes into host memory
//! run on a DMA thread of their own, from two frame-sized buffers, so the
//! copy of one frame's payload into the host overlaps the engine taking in
//! and handling the next. A third write waits for a buffer, so at most two
//! are in flight (a bound, and PM's two buffers).
//!
//! The control program sees the HAL contract unchanged: a write whose
//! address does not resolve fails at once (checked before it is queued); a
//! DMA fence, and any DMA read, first waits for every queued write, so a
//! completion's phase byte, published after its fence, never precedes the
//! payload it reports, and a read sees every earlier write. Writes are
//! applied in the order they were issued (one thread, FIFO).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use crate::dma::DmaFault;
use crate::nic::NicShared;

/// Buffers: double buffering.
const BUFFERS: usize = 2;
/// Bytes of each buffer: one frame at the largest MTU. A longer write
/// (none on the receive path) is done in place after the queue drains.
const BUFFER_BYTES: usize = emp_uapi::wire::MTU_MAX as usize;

/// One queued write.
struct Job {
    addr: u64,
    data: Vec<u8>,
}

/// Writes done, for the waiters of [`WriteBehind::drain`].
#[derive(Default)]
struct Progress {
    done: Mutex<u64>,
    cv: Condvar,
}

/// The DMA thread and its two buffers.
pub struct WriteBehind {
    shared: Arc<NicShared>,
    jobs: Option<SyncSender<Job>>,
    free: Receiver<Vec<u8>>,
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
        let (jobs, job_rx) = sync_channel::<Job>(BUFFERS);
        let (free_tx, free) = sync_channel::<Vec<u8>>(BUFFERS);
        for _ in 0..BUFFERS {
            free_tx.send(Vec::with_capacity(BUFFER_BYTES)).expect("room for every buffer");
        }
        let progress = Arc::new(Progress::default());
        let late_faults = Arc::new(AtomicU64::new(0));
        let (p, faults, s) = (progress.clone(), late_faults.clone(), shared.clone());
        let thread = std::thread::Builder::new().name(format!("emp-dma{}", shared.node)).spawn(move || {
            // Ends when the sender is dropped (the NIC's firmware stops).
            while let Ok(job) = job_rx.recv() {
                // The HAL orders every write after the ones issued before it
                // (a completion's entry before its phase byte).
                std::sync::atomic::fence(Ordering::Release);
                if s.dma.lock().expect("dma").write(job.addr, &job.data).is_err()
                    && faults.fetch_add(1, Ordering::Relaxed) == 0
                {
                    tracing::warn!(node = s.node, addr = job.addr, "DMA write to a region removed while queued");
                }
                // The engine may already be gone (shutting down): the buffer goes with it.
                let _ = free_tx.send(job.data);
                *p.done.lock().expect("progress") += 1;
                p.cv.notify_all();
            }
        })?;
        Ok(WriteBehind { shared, jobs: Some(jobs), free, progress, issued: 0, thread: Some(thread), late_faults })
    }

    /// Queues `data` for host address `addr`; fails at once if it does not
    /// resolve. Waits for a free buffer (two writes in flight at most).
    pub fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), DmaFault> {
        self.shared.dma.lock().expect("dma").check(addr, data.len())?;
        if data.len() > BUFFER_BYTES {
            self.drain();
            return self.shared.dma.lock().expect("dma").write(addr, data);
        }
        let Ok(mut buf) = self.free.recv() else {
            // The DMA thread is gone (it panicked): write in place.
            return self.shared.dma.lock().expect("dma").write(addr, data);
        };
        buf.clear();
        buf.extend_from_slice(data);
        let jobs = self.jobs.as_ref().expect("open until drop");
        if let Err(e) = jobs.send(Job { addr, data: buf }) {
            return self.shared.dma.lock().expect("dma").write(addr, &e.0.data);
        }
        self.issued += 1;
        Ok(())
    }

    /// Waits until every queued write is in host memory.
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
