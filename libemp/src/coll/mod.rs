//! Collective operations.
//!
//! - [`reduce`]: the reference combine and tree fold, the bit-exact
//!   definition of what a reduction computes, shared by every
//!   implementation and by the checkers.
//! - [`host`]: host-based collectives over EMP's tagged point-to-point
//!   messages (barriers, broadcasts, reduce, allreduce): the software
//!   algorithms the NIC offloads are measured against, and the fallback
//!   where offload does not apply.
//!
//! The plan for the NIC-offloaded versions is `docs/design/collectives.md`.

pub mod host;
pub mod reduce;

pub use emp_uapi::coll::{BarrierAlgo, Dtype, ReduceOp};
pub use host::{Comm, CommOpts, Wait};
pub use reduce::{combine, reduce_ref};
