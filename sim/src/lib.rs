//! `emp-sim`: a deterministic simulator. N NICs run the real EMP control
//! program (`emp-firmware`) against simulated host memory and hosts that
//! post work through the real SRAM rings, on a simulated wire with latency,
//! bandwidth, loss, duplication, reordering and partitions, in virtual
//! time. A seed reproduces a run bit for bit.
//!
//! - [`world`]: the event loop (`World::step` calls the control program's
//!   `Nic::handle_*` directly) and `SimHal`, the simulated hardware; read
//!   it first.
//! - [`host`]: simulated host memory and the host side of the NIC interface
//!   (admin mailbox, rings, completion queue).
//! - [`cluster`]: the scripted harness of the targeted tests, also the host
//!   driver of the cost model.
//! - [`scenario`]: seeded workloads (`Spec`, the swarm's knobs) and the
//!   driver that posts them; `plan.rs`: the drawn plan; `collplan.rs`: the
//!   swarm's collectives and what each result must be; `checker/`: the
//!   checks every run must pass (delivery, atomics, collectives, leaks).
//! - [`cost`], [`model`]: the cost model and `emp-sim model`.
//! - [`thesis`]: the EMP thesis' NIC CPU plans reproduced on per-CPU
//!   timelines (`emp-sim thesis`).
//! - [`pm`]: PM's Table 2 and Immediate Sending (Figs. 6–7) reproduced
//!   on the cost model (`emp-sim pm`).
//! - [`fuzz`]: seeded random fuzzing of wire frames and work descriptors.
//! - [`weak_dma`]: a weakly ordered DMA engine (writes late and in random
//!   byte order unless fenced), the completion contract's adversary.
//! - [`rng`]: the seeded PRNG.

pub mod bcast_repro;
mod checker;
pub mod cluster;
mod collplan;
pub mod cost;
pub mod fuzz;
pub mod host;
pub mod model;
mod plan;
pub mod pm;
pub mod rng;
pub mod scenario;
pub mod thesis;
pub mod weak_dma;
pub mod world;

pub use scenario::{run, Failure, Report, Spec};
