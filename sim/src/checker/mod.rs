//! The checkers a scenario's run must pass, kept apart from the plan that
//! draws the workload and the driver that posts it (as TigerBeetle keeps
//! `cluster/*_checker.zig` apart from its cluster):
//!
//! - [`Delivery`]: every posted message is delivered exactly once and
//!   byte-identical, or completes with the error the plan expects, and
//!   messages from one endpoint to another are matched in the order sent;
//! - [`Atomics`]: remote fetch-adds on one shared counter word run exactly
//!   once (the returned old values are a permutation of `0..k`, the word
//!   ends at `k`);
//! - [`Collectives`]: a collective completes on a member only once the
//!   members it depends on have posted, with the right result;
//! - [`Rma`]: remote writes and reads complete once with the planned
//!   status, reads deliver the target's bytes, immediate data completes
//!   one receive, and each target window ends with exactly the successful
//!   writes' bytes;
//! - [`leak`]: at quiesce no NIC table entry is held, the control program's
//!   invariants hold and no CQ overran; after the ports close, nothing is
//!   held at all.
//!
//! The driver feeds every completion to its checker as it reaps it, and
//! asks for the verdicts at quiesce. Checkers read host memory only through
//! the `read(offset, buf)` the driver hands them (the endpoint's data
//! region), so they depend on the plan, not on the driver.

mod atomic;
mod coll;
mod delivery;
pub(crate) mod leak;
pub(crate) mod rma;

pub(crate) use atomic::Atomics;
pub(crate) use coll::Collectives;
pub(crate) use delivery::Delivery;
pub(crate) use rma::Rma;
