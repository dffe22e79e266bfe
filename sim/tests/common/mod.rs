//! Two NICs with one open port each and a data region of any size, driven
//! descriptor by descriptor: for tests that reuse buffers (thousands of
//! messages) or need a region larger than `Cluster`'s (a 1 GiB message).
//! Host memory is zero until touched, so a large region costs little.

#![allow(dead_code)] // Each test binary uses part of it.

use emp_firmware::{Config, Occupancy};
use emp_sim::host::{
    admin_post, admin_result, alloc_region, mr_entry, reset_port_ctl, work_desc, HostMem, HostPort, Sram,
};
use emp_sim::rng::Rng;
use emp_sim::world::{WireConfig, World};
use emp_uapi::desc::{Cqe, MrEntry, Opcode, MR_LOCAL_READ, MR_LOCAL_WRITE};
use emp_uapi::sram::{admin_result as ar, AdminOp, LayoutParams};
use emp_uapi::{Le, PAGE_SIZE};

const CQ_ENTRIES: u32 = 1024;

/// Two nodes, port 0 open on each, with `region[i]` bytes of data region.
pub struct Pair {
    pub world: World,
    ports: Vec<HostPort>,
    next_wr: u64,
}

impl Pair {
    pub fn new(cfg: Config, mtu: u32, region: [u64; 2]) -> Pair {
        let params = LayoutParams {
            ports: 1,
            mr_entries: 16,
            route_entries: 2,
            group_entries: 1,
            staging_size: PAGE_SIZE as u32,
            send_entries: 64,
            recv_entries: 64,
        };
        let mut rng = Rng::new(11);
        let mem = region.map(|r| {
            (HostMem::pages_for_region(r) + HostMem::pages_for_region(CQ_ENTRIES as u64 * Cqe::SIZE as u64) + 4)
                * PAGE_SIZE
        });
        let mut world = World::new(2, params, mtu, 0, cfg, WireConfig::default(), rng.fork(), &mem);
        let layout = world.layout;
        let mut ports = Vec::new();
        for n in 0..2u16 {
            let node = &mut world.nodes[n as usize];
            let data = alloc_region(&mut node.mem, region[n as usize], 0x11 << 16, &mut rng);
            let cq = alloc_region(&mut node.mem, CQ_ENTRIES as u64 * Cqe::SIZE as u64, (0x22 << 16) | 1, &mut rng);
            for (reg, acc) in [(&data, MR_LOCAL_READ | MR_LOCAL_WRITE), (&cq, MR_LOCAL_WRITE)] {
                let e = mr_entry(reg, 0, acc, &mut node.mem, &mut rng);
                Sram(&mut node.sram).put(layout.mr_entry(MrEntry::slot_of(reg.key)), &e);
            }
            reset_port_ctl(&mut node.sram, &layout, 0);
            admin_post(&mut node.sram, &layout, AdminOp::PortOpen, [0, cq.key as u64, 0, CQ_ENTRIES as u64, 0, 0]);
            world.doorbell_now(n);
            assert_eq!(admin_result(&mut world.nodes[n as usize].sram, &layout), Some(ar::OK));
            ports.push(HostPort::new(0, data, cq, CQ_ENTRIES));
        }
        Pair { world, ports, next_wr: 0 }
    }

    fn post(&mut self, n: u16, opcode: Opcode, peer: u16, tag: u64, off: u64, len: u64) -> u64 {
        let wr = self.next_wr;
        self.next_wr += 1;
        let key = self.ports[n as usize].data.key;
        let d = work_desc(opcode as u8, wr, peer, 0, tag, 0, key, off, len, 2);
        let layout = self.world.layout;
        let send = opcode == Opcode::Send;
        while !self.ports[n as usize].post(&mut self.world.nodes[n as usize].sram, &layout, &d, send) {
            self.world.ring(n);
            assert!(self.world.step().is_some(), "ring full and nothing runs");
        }
        self.world.ring(n);
        wr
    }

    /// Posts a send of `len` bytes at `off` of node `n`'s region to the other node.
    pub fn send(&mut self, n: u16, tag: u64, off: u64, len: u64) -> u64 {
        self.post(n, Opcode::Send, 1 - n, tag, off, len)
    }

    /// Posts a receive of up to `len` bytes at `off` from the other node.
    pub fn recv(&mut self, n: u16, tag: u64, off: u64, len: u64) -> u64 {
        self.post(n, Opcode::Recv, 1 - n, tag, off, len)
    }

    /// Writes `data` at `off` of node `n`'s region.
    pub fn write(&mut self, n: u16, off: u64, data: &[u8]) {
        let node = &mut self.world.nodes[n as usize];
        self.ports[n as usize].data.write(&mut node.mem, off, data);
    }

    /// Reads `len` bytes at `off` of node `n`'s region.
    pub fn read(&self, n: u16, off: u64, len: usize) -> Vec<u8> {
        let mut out = vec![0; len];
        self.ports[n as usize].data.read(&self.world.nodes[n as usize].mem, off, &mut out);
        out
    }

    /// The next completion node `n`'s NIC wrote, if any.
    pub fn poll(&mut self, n: u16) -> Option<Cqe> {
        let layout = self.world.layout;
        let node = &mut self.world.nodes[n as usize];
        self.ports[n as usize].poll_cq(&mut node.sram, &layout, &node.mem)
    }

    /// Runs one event; false when nothing is left.
    pub fn step(&mut self) -> bool {
        self.world.step().is_some()
    }

    pub fn counter(&self, n: u16, c: usize) -> u64 {
        self.world.nodes[n as usize].nic.counters()[c]
    }

    pub fn occupancy(&self, n: u16) -> Occupancy {
        self.world.nodes[n as usize].nic.occupancy()
    }

    pub fn message_state_bytes(&self, n: u16) -> usize {
        self.world.nodes[n as usize].nic.message_state_bytes()
    }
}
