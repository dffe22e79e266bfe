// SPDX-License-Identifier: GPL-2.0

//! `emp.ko`: the driver of the EMP NIC, an ivshmem PCI function (1af4:1110)
//! whose BAR2 is the NIC's SRAM. This file only registers; each concern has
//! its own file (`nic.rs`: probe and firmware load).

use kernel::{pci, prelude::*};

// The contracts are the same source files userspace compiles (`uapi/`).
#[path = "../uapi/src/lib.rs"]
#[allow(dead_code, unreachable_pub, missing_docs, clippy::all)]
mod uapi;
#[allow(unused_imports)]
pub(crate) use uapi::{
    attach, coll, desc, fwabi, image, ioctl, ring, sram, wire, DecodeError, Le, ANY_NODE, ANY_PORT, PAGE_SIZE, ZEROS,
};

mod counters;
mod irq;
mod mr;
mod nic;
mod port;

struct EmpDriver;

kernel::pci_device_table!(
    PCI_TABLE,
    <EmpDriver as pci::Driver>::IdInfo,
    [(pci::DeviceId::from_id(pci::Vendor::REDHAT_QUMRANET, 0x1110), ())]
);

impl pci::Driver for EmpDriver {
    type IdInfo = ();
    type Data<'bound> = nic::Nic<'bound>;

    const ID_TABLE: pci::IdTable<Self::IdInfo> = &PCI_TABLE;

    fn probe<'bound>(
        pdev: &'bound pci::Device<kernel::device::Core<'_>>,
        _info: Option<&'bound Self::IdInfo>,
    ) -> impl PinInit<Self::Data<'bound>, Error> + 'bound {
        nic::Nic::probe(pdev)
    }
}

kernel::module_pci_driver! {
    type: EmpDriver,
    name: "emp",
    authors: ["EMP developers"],
    description: "EMP: OS-bypass message passing on a programmable NIC",
    license: "GPL v2",
}
