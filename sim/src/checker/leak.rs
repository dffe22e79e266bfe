//! Leaks: at quiesce no NIC holds a record, its control program's
//! invariants hold and no completion queue overran; once every port is
//! closed, a NIC holds nothing at all (no peer entry either).

use emp_firmware::Occupancy;
use emp_uapi::sram::ctl;

use crate::world::World;

/// Every node of `world`, at quiesce, with `ports` ports each in use;
/// `open_recvs[n]` receives on node `n` may stay posted (their message
/// was lost with its sender's retries: see `Delivery::receives_left_open`).
pub(crate) fn at_quiesce(world: &World, ports: u16, open_recvs: &[u32]) -> Result<(), String> {
    let layout = world.layout;
    for (n, node) in world.nodes.iter().enumerate() {
        let o = node.nic.occupancy();
        if o.tx_msgs
            + o.rx_msgs
            + (o.posted_recvs - open_recvs[n].min(o.posted_recvs))
            + o.overflow_used
            + o.atomics
            + o.coll_ops
            + o.coll_bufs_used
            + o.coll_cache_frames
            + o.rma_reads
            != 0
        {
            return Err(format!("leak at quiesce on node {n}: {o:?}"));
        }
        node.nic.invariants().map_err(|e| format!("node {n}: {e}"))?;
        for p in 0..ports {
            let at = layout.port(p).ctl(ctl::CQ_OVERRUNS);
            let ov = u32::from_le_bytes(node.sram[at..at + 4].try_into().expect("4 bytes"));
            if ov != 0 {
                return Err(format!("node {n} port {p}: {ov} CQ overruns"));
            }
        }
    }
    Ok(())
}

/// Node `n` after all its ports closed: `o` must be empty.
pub(crate) fn after_close(n: u16, o: Occupancy) -> Result<(), String> {
    if o != Occupancy::default() {
        return Err(format!("leak after close on node {n}: {o:?}"));
    }
    Ok(())
}
