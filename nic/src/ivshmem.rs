//! The ivshmem server side of a guest NIC (QEMU `ivshmem-doorbell`, see
//! QEMU's docs/specs/ivshmem-spec and docs/kernel.md): one listening
//! Unix stream socket per NIC; QEMU connects while it realizes the device.
//!
//! Protocol, server → QEMU only, each message one little-endian i64 with
//! at most one descriptor: `0` (version); the guest's peer id; `-1` + the
//! shared memory (the NIC's SRAM file, BAR2); then for every vector the
//! NIC's peer id with an eventfd (the guest's Doorbell writes for the NIC
//! land there: we hand QEMU the engine's own wake eventfd); then for every
//! vector the guest's id with an eventfd (the NIC writes it → the guest's
//! MSI-X vector fires). The NIC is peer 0 and never connects itself.
//!
//! One guest per NIC: a second connection while one is served is closed.
//! The NIC must outlive its guest (QEMU cannot reconnect to a restarted
//! server).

use std::io::{IoSlice, Read};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::Arc;

use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};

use crate::nic::NicShared;

/// The NIC's peer id; the guest is peer 1.
const NIC_PEER: i64 = 0;
const GUEST_PEER: i64 = 1;

/// Serves the ivshmem protocol for `nic` (whose SRAM is the file
/// `sram_path`) at `sock`, with `vectors` MSI-X vectors (the guest's
/// `ivshmem-doorbell,vectors=` must match).
pub fn serve(nic: Arc<NicShared>, sock: PathBuf, sram_path: PathBuf, vectors: u32) -> std::io::Result<()> {
    let _ = std::fs::remove_file(&sock);
    let listener = UnixListener::bind(&sock)?;
    std::thread::Builder::new().name(format!("emp-ivshmem{}", nic.node)).spawn(move || {
        for conn in listener.incoming() {
            let conn = match conn {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(node = nic.node, "ivshmem accept: {e}");
                    std::thread::sleep(std::time::Duration::from_millis(10));
                    continue;
                }
            };
            if nic.guest_irq.lock().expect("guest_irq").is_some() {
                tracing::warn!(node = nic.node, "ivshmem: a guest is already attached; refusing another");
                continue;
            }
            match greet(&nic, &conn, &sram_path, vectors) {
                Ok(irq) => {
                    tracing::info!(node = nic.node, vectors, "ivshmem: guest attached");
                    *nic.guest_irq.lock().expect("guest_irq") = Some(irq);
                    let nic = nic.clone();
                    // The connection stays open while the guest lives; its
                    // end (QEMU exits) detaches the interrupt.
                    let _ = std::thread::Builder::new().name("emp-ivshmem-peer".into()).spawn(move || {
                        let mut conn = conn;
                        let mut b = [0u8; 64];
                        while matches!(conn.read(&mut b), Ok(n) if n > 0) {}
                        *nic.guest_irq.lock().expect("guest_irq") = None;
                        tracing::info!(node = nic.node, "ivshmem: guest detached");
                    });
                }
                Err(e) => tracing::warn!(node = nic.node, "ivshmem: greeting the guest failed: {e}"),
            }
        }
    })?;
    Ok(())
}

fn send(conn: RawFd, v: i64, fd: Option<RawFd>) -> std::io::Result<()> {
    let b = v.to_le_bytes();
    let iov = [IoSlice::new(&b)];
    let fds = fd.map(|f| [f]);
    let cmsg = fds.as_ref().map(|f| [ControlMessage::ScmRights(f)]);
    let cm: &[ControlMessage] = cmsg.as_ref().map(|c| &c[..]).unwrap_or(&[]);
    let n = sendmsg::<()>(conn, &iov, cm, MsgFlags::MSG_NOSIGNAL, None)?;
    if n != b.len() {
        return Err(std::io::Error::other("short ivshmem message"));
    }
    Ok(())
}

/// Sends the greeting; returns the eventfd of the guest's vector 0.
fn greet(nic: &NicShared, conn: &UnixStream, sram_path: &std::path::Path, vectors: u32) -> std::io::Result<OwnedFd> {
    let c = conn.as_raw_fd();
    let shm = std::fs::OpenOptions::new().read(true).write(true).open(sram_path)?;
    send(c, 0, None)?;
    send(c, GUEST_PEER, None)?;
    send(c, -1, Some(shm.as_raw_fd()))?;
    for _ in 0..vectors {
        send(c, NIC_PEER, Some(nic.wake.as_raw_fd()))?;
    }
    let mut irq = None;
    for _ in 0..vectors {
        let e = crate::sys::eventfd(libc::EFD_NONBLOCK)?;
        send(c, GUEST_PEER, Some(e.as_raw_fd()))?;
        irq.get_or_insert(e);
    }
    irq.ok_or_else(|| std::io::Error::other("no vectors"))
}
