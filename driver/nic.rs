// SPDX-License-Identifier: GPL-2.0

//! Probe: bind only an ivshmem function whose BAR2 carries the EMP board
//! signature and a supported layout; then load the control program.
//!
//! Boot order (field order of the bring-up): enable + bus master → map BAR2
//! → check signature and layout → `request_firmware("emp/emp-fw.bin")` →
//! write it into the staging area → status LOADING → wait (bounded) for
//! RUNNING, or report the NIC's reason and fail the probe.

use core::mem::offset_of;

use kernel::{
    device::Core,
    firmware::Firmware,
    io::Io,
    pci,
    prelude::*,
    sync::Arc,
    time::{delay::fsleep, Delta},
};

use crate::sram::{FailReason, Layout, NicStatus, SramHeader, BOARD_SIGNATURE, LAYOUT_VERSION};
use crate::Le;

/// How long the NIC may take to verify and start the control program.
// TIMEOUT: verifying a 5 MB image (SHA-256 + ed25519) takes well under 1 s.
const BOOT_TIMEOUT_MS: i64 = 5000;

/// A bound EMP NIC. Fields drop in order: the interrupt is freed, then
/// `/dev/emp-nic` goes away, before
/// BAR2 is unmapped and released.
pub(crate) struct Nic<'bound> {
    _irq: Option<crate::irq::Irq>,
    _dev: Pin<KBox<crate::port::NicDev>>,
    _bar: pci::Bar<'bound>,
}

impl<'bound> Nic<'bound> {
    pub(crate) fn probe(pdev: &'bound pci::Device<Core<'_>>) -> Result<Self> {
        pdev.enable_device_mem()?;
        pdev.set_master();
        let bar = pdev.iomap_region(2, c"emp-sram")?;
        let magic = bar.try_read64(0)?;
        if magic != BOARD_SIGNATURE {
            dev_info!(pdev, "BAR2 carries no EMP board signature: not an EMP NIC\n");
            return Err(ENODEV);
        }
        let version = bar.try_read32(offset_of!(SramHeader, layout_version))?;
        if version != LAYOUT_VERSION {
            dev_err!(pdev, "EMP layout version {} unsupported (driver knows {})\n", version, LAYOUT_VERSION);
            return Err(ENODEV);
        }
        let header = read_header(&bar)?;
        let layout = match Layout::from_header(&header) {
            Ok(l) => l,
            Err(e) => {
                dev_err!(pdev, "EMP SRAM header invalid: {}\n", e.as_str());
                return Err(ENODEV);
            }
        };
        let bar_len = pdev.resource_len(2)?;
        if (layout.sram_size as u64) > bar_len {
            dev_err!(pdev, "SRAM of {} bytes does not fit BAR2 ({} bytes)\n", layout.sram_size, bar_len);
            return Err(ENODEV);
        }
        load_firmware(pdev, &bar, &layout)?;
        let info = Arc::pin_init(
            crate::port::NicInfo::new(header.node_id, header.mtu, header.features, layout, pdev.resource_start(2)?),
            GFP_KERNEL,
        )?;
        info.attach_mmio()?;
        let irq = match crate::irq::Irq::request(pdev.as_ref(), info.clone()) {
            Ok(irq) => Some(irq),
            Err(e) => {
                dev_info!(pdev, "no MSI-X vector ({:?}): ports get no completion events\n", e);
                None
            }
        };
        let dev = KBox::pin_init(crate::port::NicDev::new(info)?, GFP_KERNEL)?;
        dev_info!(
            pdev,
            "EMP NIC node {} running, {} ports, MTU {}: /dev/{}\n",
            header.node_id,
            header.port_count,
            header.mtu,
            dev.node_name().to_str().unwrap_or("?")
        );
        Ok(Nic { _irq: irq, _dev: dev, _bar: bar })
    }
}

fn status(bar: &pci::Bar<'_>) -> Result<(u32, u32)> {
    Ok((bar.try_read32(offset_of!(SramHeader, status))?, bar.try_read32(offset_of!(SramHeader, fail_reason))?))
}

/// Writes the signed image into the staging area and asks the NIC to
/// verify and start it.
fn load_firmware(pdev: &pci::Device, bar: &pci::Bar<'_>, layout: &Layout) -> Result {
    let fw = Firmware::request(c"emp/emp-fw.bin", pdev.as_ref())?;
    let data = fw.data();
    if data.len() > layout.params.staging_size as usize {
        dev_err!(pdev, "firmware image of {} bytes exceeds the staging area\n", data.len());
        return Err(EFBIG);
    }
    let base = layout.staging_off as usize;
    for (i, chunk) in data.chunks(4).enumerate() {
        let mut w = [0u8; 4];
        w[..chunk.len()].copy_from_slice(chunk);
        bar.try_write32(u32::from_le_bytes(w), base + 4 * i)?;
    }
    bar.try_write32(data.len() as u32, offset_of!(SramHeader, staged_len))?;
    bar.try_write32(NicStatus::Loading as u32, offset_of!(SramHeader, status))?;
    let mut waited = 0;
    loop {
        let (status, reason) = status(bar)?;
        match NicStatus::from_u32(status) {
            Some(NicStatus::Running) => return Ok(()),
            Some(NicStatus::Failed) => {
                let why = FailReason::from_u32(reason).map(|r| r.as_str()).unwrap_or("unknown reason");
                dev_err!(pdev, "the NIC refused the firmware: {}\n", why);
                return Err(EIO);
            }
            _ if waited >= BOOT_TIMEOUT_MS => {
                dev_err!(pdev, "the NIC did not start the firmware within {} ms\n", BOOT_TIMEOUT_MS);
                return Err(ETIMEDOUT);
            }
            _ => {
                fsleep(Delta::from_millis(10));
                waited += 10;
            }
        }
    }
}

fn read_header(bar: &pci::Bar<'_>) -> Result<SramHeader> {
    let mut b = [0u8; SramHeader::SIZE];
    for i in 0..SramHeader::SIZE / 4 {
        let w = bar.try_read32(4 * i)?;
        b[4 * i..4 * i + 4].copy_from_slice(&w.to_le_bytes());
    }
    Ok(SramHeader::get(&b))
}
