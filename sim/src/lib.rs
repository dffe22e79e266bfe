//! `emp-sim`: a deterministic simulator. N NICs run the real EMP control
//! program (`emp-firmware`) against simulated host memory and hosts that
//! post work through the real SRAM rings, on a simulated wire with latency,
//! bandwidth, loss, duplication, reordering and partitions, in virtual
//! time. A seed reproduces a run bit for bit.

mod checker;
pub mod cluster;
mod collplan;
pub mod cost;
pub mod host;
pub mod model;
mod plan;
pub mod rng;
pub mod scenario;
pub mod weak_dma;
pub mod world;

pub use scenario::{run, Failure, Report, Spec};
