//! The emulated programmable NIC ("the hardware"): SRAM in shared memory,
//! DMA engines into host memory, a MAC on a wire backend, doorbells and
//! interrupts as eventfds, and a loader that verifies and runs a signed
//! control-program image. `emp-nicd` hosts one or more NICs (a chassis).

pub mod attach;
pub mod cpus;
pub mod dma;
pub mod dmaq;
pub mod engine;
pub mod firmware;
pub mod fwlib;
mod hw;
pub mod image;
pub mod ivshmem;
pub mod nic;
pub mod route;
pub mod sram;
mod sys;
pub mod wire;
