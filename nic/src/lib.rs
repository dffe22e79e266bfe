//! The emulated programmable NIC ("the hardware"): SRAM in shared memory,
//! DMA engines into host memory, a MAC on a wire backend, doorbells and
//! interrupts as eventfds, and a loader that verifies and runs a signed
//! control-program image.

pub mod image;
