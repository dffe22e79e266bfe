//! A scripted cluster for targeted protocol tests (in the spirit of
//! quinn's `Pair`): N NICs with one open port each, explicit sends and
//! receives, explicit time, and completions to assert on.
//!
//! It is also the simulated host driver of the cost model
//! ([`crate::cost`]): under `world.cost`, each host posts and reaps one
//! thing at a time and pays for it; a descriptor reaches the ring when the
//! host finished writing it, a completion is visible when the host finished
//! reaping it.

use emp_firmware::Config;
use emp_uapi::coll::{reduce_tag, BarrierAlgo, Dtype, ReduceOp, GROUP_INLINE_MAX, TREE_ROOT, TREE_ROOT_WIDE};
use emp_uapi::desc::{
    Cqe, MrEntry, Opcode, RemoteSge, Sge, WorkDesc, MR_LOCAL_READ, MR_LOCAL_WRITE, WD_IMM, WD_SIGNALED,
};
use emp_uapi::sram::{admin_result as ar, ctl, AdminOp, GroupEntry, LayoutParams};
use emp_uapi::{Le, PAGE_SIZE};

use std::collections::VecDeque;

use crate::host::{
    admin_post, admin_result, alloc_region, mr_entry, reset_port_ctl, work_desc, HostMem, HostPort, Region, Sram,
};
use crate::rng::Rng;
use crate::world::{Step, WireConfig, World};

/// Bytes of each node's data region.
const REGION: u64 = 8 << 20;
/// Smallest data region [`Cluster::with_region`] takes: the context image
/// room and as much again for buffers.
pub const MIN_REGION: u64 = 2 * IMAGE_ROOM;
/// CQ entries per port.
const CQ_ENTRIES: u32 = 1024;
/// Spare host pages per node (page lists of extra registrations).
const SPARE_PAGES: usize = 64;
/// MR table slot of the first extra registration ([`Cluster::reg_mr`]).
const EXTRA_MR_SLOT: u32 = 16;

/// Where a saved port context is (`Cluster::save`): in the port's data
/// region, with the identity the trusted side parked.
#[derive(Clone, Copy, Debug)]
pub struct SavedContext {
    /// Offset of the image in the data region.
    pub off: u64,
    /// Bytes of the image (its header's length).
    pub len: u64,
    /// Wire address and generation of the saved port.
    pub addr: u16,
    /// Generation.
    pub gen: u16,
}

/// The owner the trusted side gives a parked job's MR entries: no slot.
const PARKED_OWNER: u16 = u16::MAX;

/// Room reserved for a context image in a data region.
pub const IMAGE_ROOM: u64 = 256 << 10;

/// N nodes, port 0 open on each.
pub struct Cluster {
    /// The simulated world.
    pub world: World,
    ports: Vec<HostPort>,
    bump: Vec<u64>,
    /// Receive buffers by wr_id: (node, offset, len).
    bufs: Vec<(u16, u64, u64)>,
    /// Completions reaped, with the time the host is done reaping each.
    completions: Vec<Vec<(Cqe, u64)>>,
    /// Descriptors a host is still writing (cost model): (ready at, desc, send ring).
    pending: Vec<VecDeque<(u64, WorkDesc, bool)>>,
    /// When each host is free again (cost model).
    host_free_at: Vec<u64>,
    /// Host time spent posting and reaping, per node (cost model).
    pub host_busy_ns: Vec<u64>,
    rng: Rng,
    /// Extra registrations: (node, region over part of the data region).
    extra: Vec<(u16, Region)>,
    /// Bytes of each node's data region.
    region: u64,
    /// Group table slots loaded per node (their entries move with a
    /// switched-out port, as its MR entries do).
    group_slots: Vec<Vec<u32>>,
}

impl Cluster {
    /// Boots `nodes` NICs (`ports` windows each, port 0 opened) and opens port 0.
    pub fn new(nodes: u16, cfg: Config, features: u32, mtu: u32, wire: WireConfig) -> Cluster {
        Cluster::build(nodes, cfg, features, mtu, wire, REGION, 64)
    }

    /// As [`Cluster::new`] with a data region of `region` bytes per node
    /// (default 8 MiB; a large cluster that moves little needs less host
    /// memory: 1024 nodes × 8 MiB is 8 GiB).
    ///
    /// # Panics
    /// If `region` is below [`MIN_REGION`].
    pub fn with_region(nodes: u16, cfg: Config, features: u32, mtu: u32, wire: WireConfig, region: u64) -> Cluster {
        assert!(region >= MIN_REGION, "data region of {region} B: at least {MIN_REGION}");
        Cluster::build(nodes, cfg, features, mtu, wire, region, 64)
    }

    /// As [`Cluster::new`], with `ring_entries` slots (a power of two) in
    /// every port's send and receive ring.
    pub fn with_rings(
        nodes: u16,
        cfg: Config,
        features: u32,
        mtu: u32,
        wire: WireConfig,
        ring_entries: u32,
    ) -> Cluster {
        Cluster::build(nodes, cfg, features, mtu, wire, REGION, ring_entries)
    }

    fn build(
        nodes: u16,
        cfg: Config,
        features: u32,
        mtu: u32,
        wire: WireConfig,
        region: u64,
        ring_entries: u32,
    ) -> Cluster {
        let params = LayoutParams {
            ports: 4,
            mr_entries: 64,
            route_entries: nodes as u32,
            // Room for a 1024-member group with its trees (`GroupEntry::span`).
            group_entries: 64,
            staging_size: PAGE_SIZE as u32,
            send_entries: ring_entries,
            recv_entries: ring_entries,
        };
        let mut rng = Rng::new(7);
        let pages = HostMem::pages_for_region(region)
            + HostMem::pages_for_region(CQ_ENTRIES as u64 * Cqe::SIZE as u64)
            + SPARE_PAGES;
        let mem = vec![pages * PAGE_SIZE; nodes as usize];
        let world = World::new(nodes, params, mtu, features, cfg, wire, rng.fork(), &mem);
        let k = nodes as usize;
        let mut c = Cluster {
            world,
            ports: Vec::new(),
            bump: vec![0; k],
            bufs: Vec::new(),
            completions: vec![Vec::new(); k],
            pending: vec![VecDeque::new(); k],
            host_free_at: vec![0; k],
            host_busy_ns: vec![0; k],
            rng,
            extra: Vec::new(),
            region,
            group_slots: vec![Vec::new(); nodes as usize],
        };
        for n in 0..nodes {
            let p = c.open_port(n, 0).expect("open port 0");
            c.ports.push(p);
        }
        c
    }

    /// Registers regions for `port` on `node` and opens it.
    fn open_port(&mut self, n: u16, port: u16) -> Result<HostPort, u32> {
        let layout = self.world.layout;
        let node = &mut self.world.nodes[n as usize];
        let data = alloc_region(&mut node.mem, self.region, (0x11 << 16) | (2 * port as u32), &mut self.rng);
        let cq = alloc_region(
            &mut node.mem,
            CQ_ENTRIES as u64 * Cqe::SIZE as u64,
            (0x22 << 16) | (2 * port as u32 + 1),
            &mut self.rng,
        );
        for (reg, acc) in [(&data, MR_LOCAL_READ | MR_LOCAL_WRITE), (&cq, MR_LOCAL_WRITE)] {
            let e = mr_entry(reg, port, acc, &mut node.mem, &mut self.rng);
            Sram(&mut node.sram).put(layout.mr_entry(MrEntry::slot_of(reg.key)), &e);
        }
        reset_port_ctl(&mut node.sram, &layout, port);
        admin_post(
            &mut node.sram,
            &layout,
            AdminOp::PortOpen,
            [port as u64, cq.key as u64, 0, CQ_ENTRIES as u64, 0, 0],
        );
        self.world.doorbell_now(n);
        match admin_result(&mut self.world.nodes[n as usize].sram, &layout) {
            Some(ar::OK) => Ok(HostPort::new(port, data, cq, CQ_ENTRIES)),
            r => Err(r.unwrap_or(u32::MAX)),
        }
    }

    /// Runs one admin command on `node` and returns its result.
    pub fn admin(&mut self, n: u16, op: AdminOp, args: [u64; 6]) -> u32 {
        let layout = self.world.layout;
        admin_post(&mut self.world.nodes[n as usize].sram, &layout, op, args);
        self.world.doorbell_now(n);
        self.drain(n);
        admin_result(&mut self.world.nodes[n as usize].sram, &layout).expect("admin commands run at once")
    }

    /// The slot `node`'s job port is in now (it moves when restored elsewhere).
    pub fn port_slot(&self, n: u16) -> u16 {
        self.ports[n as usize].port
    }

    /// C1: suspends `node`'s job port.
    pub fn suspend(&mut self, n: u16) -> u32 {
        let p = self.ports[n as usize].port as u64;
        self.admin(n, AdminOp::PortSuspend, [p, 0, 0, 0, 0, 0])
    }

    /// C2–C4: is `node`'s suspended job port stable?
    pub fn is_stable(&mut self, n: u16) -> bool {
        let p = self.ports[n as usize].port as u64;
        self.admin(n, AdminOp::PortStable, [p, 0, 0, 0, 0, 0]) == ar::OK
    }

    /// C8: resumes `node`'s job port.
    pub fn resume(&mut self, n: u16) -> u32 {
        let p = self.ports[n as usize].port as u64;
        self.admin(n, AdminOp::PortResume, [p, 0, 0, 0, 0, 0])
    }

    /// C6: saves `node`'s job port into its data region (the room is
    /// reserved once per node, at the region's end).
    pub fn save(&mut self, n: u16) -> Result<SavedContext, u32> {
        let hp = &self.ports[n as usize];
        let (port, key) = (hp.port, hp.data.key);
        let off = self.region - IMAGE_ROOM;
        let nic = &self.world.nodes[n as usize].nic;
        let (addr, gen) = (nic.port_addr(port), nic.port_gen(port));
        let r = self.admin(n, AdminOp::PortSave, [port as u64, key as u64, off, IMAGE_ROOM, 0, 0]);
        if r != ar::OK {
            return Err(r);
        }
        // The trusted side keeps the parked job's registrations, owned by
        // no slot, so a job opened in the freed slot cannot use them.
        self.move_mrs(n, PARKED_OWNER);
        self.move_groups(n, port, PARKED_OWNER);
        let mut len = [0u8; 4];
        self.ports[n as usize].data.read(&self.world.nodes[n as usize].mem, off + 8, &mut len);
        Ok(SavedContext { off, len: u32::from_le_bytes(len) as u64, addr, gen })
    }

    /// The bytes of a saved image.
    pub fn image(&self, n: u16, ctx: &SavedContext) -> Vec<u8> {
        let mut b = vec![0u8; ctx.len as usize];
        self.ports[n as usize].data.read(&self.world.nodes[n as usize].mem, ctx.off, &mut b);
        b
    }

    /// Overwrites a saved image (a host corrupting it).
    pub fn write_image(&mut self, n: u16, ctx: &SavedContext, bytes: &[u8]) {
        self.ports[n as usize].data.write(&mut self.world.nodes[n as usize].mem, ctx.off, bytes);
    }

    /// C7: restores `ctx` (`len` bytes of it) into slot `slot` of `node`.
    /// As the trusted side, first moves the job's MR entries to that slot
    /// (and fences them); on success the host goes on in the new window.
    pub fn restore_len(&mut self, n: u16, ctx: &SavedContext, slot: u16, len: u64) -> u32 {
        let data_key = self.ports[n as usize].data.key;
        self.move_mrs(n, slot);
        self.move_groups(n, PARKED_OWNER, slot);
        let id = ctx.addr as u64 | (ctx.gen as u64) << 16;
        let r = self.admin(n, AdminOp::PortRestore, [slot as u64, data_key as u64, ctx.off, len, id, 0]);
        if r == ar::OK {
            self.ports[n as usize].port = slot;
        } else {
            self.move_mrs(n, PARKED_OWNER);
            self.move_groups(n, slot, PARKED_OWNER);
        }
        r
    }

    /// Gives the group table entries of `node` owned by `from` to `to`
    /// (the trusted side's part: a parked context's groups stay in the
    /// table, owned by no slot, and follow it into the slot it restores to).
    fn move_groups(&mut self, n: u16, from: u16, to: u16) {
        let layout = self.world.layout;
        let sram = &mut self.world.nodes[n as usize].sram;
        for &s in &self.group_slots[n as usize] {
            let at = layout.group_entry(s as usize);
            let mut e = GroupEntry::get(&sram[at..at + GroupEntry::SIZE]);
            if e.port == from {
                e.port = to;
                e.put(&mut sram[at..at + GroupEntry::SIZE]);
            }
        }
    }

    /// Gives the job's MR entries (data and CQ) to `owner` and fences them
    /// (the trusted side's part of a save and a restore).
    fn move_mrs(&mut self, n: u16, owner: u16) {
        let layout = self.world.layout;
        for key in [self.ports[n as usize].data.key, self.ports[n as usize].cq.key] {
            let at = layout.mr_entry(MrEntry::slot_of(key));
            let node = &mut self.world.nodes[n as usize];
            let mut e: MrEntry = Sram(&mut node.sram).get(at);
            e.port = owner;
            Sram(&mut node.sram).put(at, &e);
            assert_eq!(self.admin(n, AdminOp::MrFence, [MrEntry::slot_of(key) as u64, 0, 0, 0, 0, 0]), ar::OK);
        }
    }

    /// C7 with the image's own length.
    pub fn restore(&mut self, n: u16, ctx: &SavedContext, slot: u16) -> u32 {
        self.restore_len(n, ctx, slot, ctx.len)
    }

    /// Opens another job's port on `node` in slot `slot` with wire address
    /// `addr` and its own regions (MR slots 32 + 2·slot and the next);
    /// the caller drives it through the returned host port.
    pub fn open_other_job(&mut self, n: u16, slot: u16, addr: u16) -> Result<HostPort, u32> {
        let layout = self.world.layout;
        let node = &mut self.world.nodes[n as usize];
        let data = alloc_region(&mut node.mem, 64 << 10, (0x33 << 16) | (32 + 2 * slot as u32), &mut self.rng);
        let cq = alloc_region(
            &mut node.mem,
            CQ_ENTRIES as u64 * Cqe::SIZE as u64,
            (0x44 << 16) | (33 + 2 * slot as u32),
            &mut self.rng,
        );
        for (reg, acc) in [(&data, MR_LOCAL_READ | MR_LOCAL_WRITE), (&cq, MR_LOCAL_WRITE)] {
            let e = mr_entry(reg, slot, acc, &mut node.mem, &mut self.rng);
            Sram(&mut node.sram).put(layout.mr_entry(MrEntry::slot_of(reg.key)), &e);
        }
        reset_port_ctl(&mut node.sram, &layout, slot);
        let explicit = emp_uapi::sram::PORT_ADDR_EXPLICIT | addr as u64;
        let r = self.admin(n, AdminOp::PortOpen, [slot as u64, cq.key as u64, 0, CQ_ENTRIES as u64, 0, explicit]);
        if r != ar::OK {
            return Err(r);
        }
        Ok(HostPort::new(slot, data, cq, CQ_ENTRIES))
    }

    /// Closes the job port of `node` (as when its process dies).
    pub fn close_port(&mut self, n: u16) -> Option<u32> {
        let layout = self.world.layout;
        let p = self.ports[n as usize].port as u64;
        admin_post(&mut self.world.nodes[n as usize].sram, &layout, AdminOp::PortClose, [p, 0, 0, 0, 0, 0]);
        self.world.doorbell_now(n);
        self.drain(n);
        admin_result(&mut self.world.nodes[n as usize].sram, &layout)
    }

    fn alloc(&mut self, n: u16, len: u64) -> u64 {
        let off = self.bump[n as usize];
        self.bump[n as usize] += len + 64;
        assert!(self.bump[n as usize] <= self.region - IMAGE_ROOM, "test region exhausted");
        off
    }

    /// Posts a send of `data` from `node` to (dst node, port 0); returns its wr_id.
    pub fn send(&mut self, n: u16, dst: u16, tag: u64, data: &[u8]) -> u64 {
        let off = self.alloc(n, data.len() as u64);
        let node = &mut self.world.nodes[n as usize];
        self.ports[n as usize].data.write(&mut node.mem, off, data);
        let key = self.ports[n as usize].data.key;
        let d = work_desc(Opcode::Send as u8, self.bufs.len() as u64, dst, 0, tag, 0, key, off, data.len() as u64, 2);
        self.post(n, d, true, data.len() as u64)
    }

    /// A send of `data` from `node` to (dst node, port 0) whose descriptor
    /// the host writes into its send ring's next slot only as far as
    /// `written` bytes, and does not publish: a host stopped in the middle
    /// of posting. [`Cluster::finish_unpublished`] writes the rest and
    /// publishes it. Returns its wr_id and the descriptor's bytes.
    pub fn send_unpublished(
        &mut self,
        n: u16,
        dst: u16,
        tag: u64,
        data: &[u8],
        written: usize,
    ) -> (u64, [u8; WorkDesc::SIZE]) {
        assert!(self.pending[n as usize].is_empty(), "descriptors still being written (cost model)");
        let hp = &self.ports[n as usize];
        let w = self.world.layout.port(hp.port);
        let cons = Sram(&mut self.world.nodes[n as usize].sram).u32(w.ctl(ctl::SEND_CONS));
        assert!(emp_uapi::ring::has_room(hp.send_prod, cons, w.send_entries), "send ring full");
        let off = self.alloc(n, data.len() as u64);
        let node = &mut self.world.nodes[n as usize];
        self.ports[n as usize].data.write(&mut node.mem, off, data);
        let key = self.ports[n as usize].data.key;
        let wr = self.bufs.len() as u64;
        self.bufs.push((n, 0, 0));
        let d = work_desc(Opcode::Send as u8, wr, dst, 0, tag, 0, key, off, data.len() as u64, 2);
        let mut b = [0u8; WorkDesc::SIZE];
        d.put(&mut b);
        self.write_send_slot(n, &b[..written], 0);
        (wr, b)
    }

    /// Writes `bytes[from..]` into `node`'s next send ring slot (in the
    /// window of the slot its port is in now) and publishes the slot.
    pub fn finish_unpublished(&mut self, n: u16, bytes: &[u8; WorkDesc::SIZE], from: usize) {
        self.write_send_slot(n, &bytes[from..], from);
        let layout = self.world.layout;
        let hp = &mut self.ports[n as usize];
        hp.send_prod = hp.send_prod.wrapping_add(1);
        let w = layout.port(hp.port);
        Sram(&mut self.world.nodes[n as usize].sram).put_u32(w.ctl(ctl::SEND_PROD), hp.send_prod);
        self.world.ring(n);
    }

    fn write_send_slot(&mut self, n: u16, bytes: &[u8], at: usize) {
        let hp = &self.ports[n as usize];
        let slot = self.world.layout.port(hp.port).send_slot(hp.send_prod) + at;
        self.world.nodes[n as usize].sram[slot..slot + bytes.len()].copy_from_slice(bytes);
    }

    /// The bytes of both rings of `node`'s port window (as its host sees them).
    pub fn ring_bytes(&self, n: u16) -> Vec<u8> {
        let w = self.world.layout.port(self.ports[n as usize].port);
        let from = w.send_slot(0);
        let to = w.recv_slot(0) + w.recv_entries as usize * WorkDesc::SIZE;
        self.world.nodes[n as usize].sram[from..to].to_vec()
    }

    /// As [`Cluster::send`], with immediate data `imm` (`WD_IMM`): the
    /// receive's completion reports it.
    pub fn send_imm(&mut self, n: u16, dst: u16, tag: u64, data: &[u8], imm: u32) -> u64 {
        let off = self.alloc(n, data.len() as u64);
        let node = &mut self.world.nodes[n as usize];
        self.ports[n as usize].data.write(&mut node.mem, off, data);
        let key = self.ports[n as usize].data.key;
        let mut d =
            work_desc(Opcode::Send as u8, self.bufs.len() as u64, dst, 0, tag, 0, key, off, data.len() as u64, 2);
        d.ignore = imm as u64;
        d.flags |= WD_IMM;
        self.post(n, d, true, data.len() as u64)
    }

    /// Posts a send of `len` bytes at `off` of `node`'s data region (bytes
    /// already there, e.g. a receive's buffer: [`Cluster::buffer`]) to (dst
    /// node, port 0); returns its wr_id.
    pub fn send_from(&mut self, n: u16, dst: u16, tag: u64, off: u64, len: u64) -> u64 {
        assert!(off + len <= self.region, "beyond the data region");
        let key = self.ports[n as usize].data.key;
        let d = work_desc(Opcode::Send as u8, self.bufs.len() as u64, dst, 0, tag, 0, key, off, len, 2);
        self.post(n, d, true, len)
    }

    /// As [`Cluster::send_from`], the buffer described by one piece.
    pub fn send_contiguous(&mut self, n: u16, dst: u16, tag: u64, off: u64, len: u64) -> u64 {
        assert!(off + len <= self.region, "beyond the data region");
        let key = self.ports[n as usize].data.key;
        let d = work_desc(Opcode::Send as u8, self.bufs.len() as u64, dst, 0, tag, 0, key, off, len, 1);
        self.post(n, d, true, len)
    }

    /// Where a receive (or collective) delivers: (offset in the data region, length).
    pub fn buffer(&self, wr: u64) -> (u64, u64) {
        let (_, off, len) = self.bufs[wr as usize];
        (off, len)
    }

    /// Posts a raw descriptor (for malformed-input tests); returns its wr_id.
    pub fn post_raw(&mut self, n: u16, mut d: WorkDesc, send: bool) -> u64 {
        d.wr_id = self.bufs.len() as u64;
        self.post(n, d, send, 0)
    }

    /// Stores `d` in persistent slot `slot` of `node`'s send (or receive)
    /// ring table (`WD_PERSIST`): it runs at each [`Cluster::start`]. A
    /// receive's buffer is registered under the starts' wr_ids.
    pub fn store(&mut self, n: u16, slot: u8, mut d: WorkDesc, send: bool) {
        d.flags |= emp_uapi::desc::WD_PERSIST;
        d.slot = slot;
        self.post_desc(n, d, send);
    }

    /// Starts persistent slot `slot` of `node`'s send (or receive) ring;
    /// returns the start's wr_id. The slot's bytes past the start's `tag`
    /// are left as garbage: the NIC must not read them. A started receive
    /// delivers into (`off`, `len`) of the data region (as stored).
    pub fn start(&mut self, n: u16, slot: u8, send: bool, off: u64, len: u64) -> u64 {
        let wr = self.bufs.len() as u64;
        self.bufs.push((n, off, len));
        let mut d = WorkDesc { wr_id: wr, opcode: Opcode::Start as u8, tag: slot as u64, ..Default::default() };
        d.ignore = 0xDEAD_BEEF_0BAD_F00D;
        d.sge[0] = emp_uapi::desc::Sge { key: 0xFFFF_FFFF, len: 7, offset: u64::MAX };
        self.post_desc(n, d, send);
        wr
    }

    /// The data region key of `node`'s port 0.
    pub fn data_key(&self, n: u16) -> u32 {
        self.ports[n as usize].data.key
    }

    /// Posts a receive of up to `len` bytes from (src node, src port) (or
    /// wildcards) with `tag`/`ignore`; returns its wr_id.
    pub fn recv(&mut self, n: u16, src: (u16, u16), tag: u64, ignore: u64, len: u64) -> u64 {
        let off = self.alloc(n, len);
        let key = self.ports[n as usize].data.key;
        let wr = self.bufs.len() as u64;
        let d = work_desc(Opcode::Recv as u8, wr, src.0, src.1, tag, ignore, key, off, len, 3);
        self.bufs.push((n, off, len));
        self.post(n, d, false, 0);
        wr
    }

    /// Posts a receive of `len` bytes into `off` of `node`'s data region,
    /// described by one piece (buffers reused across receives, e.g. a
    /// benchmark's); returns its wr_id.
    pub fn recv_into(&mut self, n: u16, src: (u16, u16), tag: u64, off: u64, len: u64) -> u64 {
        assert!(off + len <= self.region, "beyond the data region");
        let key = self.ports[n as usize].data.key;
        let wr = self.bufs.len() as u64;
        let d = work_desc(Opcode::Recv as u8, wr, src.0, src.1, tag, 0, key, off, len, 1);
        self.bufs.push((n, off, len));
        self.post(n, d, false, 0);
        wr
    }

    /// Posts a probe for an unexpected message matching (`src`, `tag`,
    /// `ignore`) at `node` (claiming it with `claim`); returns its wr_id.
    /// Its completion says what was found (`byte_len` = the claim handle).
    pub fn probe(&mut self, n: u16, src: (u16, u16), tag: u64, ignore: u64, claim: bool) -> u64 {
        let wr = self.bufs.len() as u64;
        let flags = if claim { emp_uapi::desc::WD_CLAIM } else { 0 };
        let d = WorkDesc {
            opcode: Opcode::Probe as u8,
            flags,
            wr_id: wr,
            node: src.0,
            port: src.1,
            tag,
            ignore,
            ..WorkDesc::default()
        };
        self.bufs.push((n, 0, 0));
        self.post(n, d, false, 0)
    }

    /// Posts a receive of up to `len` bytes that takes the message a probe
    /// claimed with `handle`; returns its wr_id.
    pub fn recv_claimed(&mut self, n: u16, handle: u32, len: u64) -> u64 {
        let off = self.alloc(n, len);
        let key = self.ports[n as usize].data.key;
        let wr = self.bufs.len() as u64;
        let mut d = work_desc(Opcode::Recv as u8, wr, 0, 0, handle as u64, 0, key, off, len, 3);
        d.flags |= emp_uapi::desc::WD_CLAIM;
        self.bufs.push((n, off, len));
        self.post(n, d, false, 0);
        wr
    }

    /// Posts `d`; a send of `copy` bytes costs the host that much copying.
    fn post(&mut self, n: u16, d: WorkDesc, send: bool, copy: u64) -> u64 {
        if send {
            self.bufs.push((n, 0, 0));
        }
        self.post_desc_copy(n, d, send, copy)
    }

    fn post_desc(&mut self, n: u16, d: WorkDesc, send: bool) -> u64 {
        self.post_desc_copy(n, d, send, 0)
    }

    /// Host time: `node`'s host does `ns` of work as soon as it is free;
    /// returns when it is done.
    fn host_work(&mut self, n: u16, ns: u64) -> u64 {
        let start = self.host_free_at[n as usize].max(self.world.now);
        self.host_free_at[n as usize] = start + ns;
        self.host_busy_ns[n as usize] += ns;
        start + ns
    }

    fn post_desc_copy(&mut self, n: u16, d: WorkDesc, send: bool, copy: u64) -> u64 {
        let ns = self.world.cost.post_ns(copy);
        if ns > 0 || !self.pending[n as usize].is_empty() {
            // The host writes the descriptor when it is free; the NIC sees it after.
            let ready = self.host_work(n, ns);
            self.pending[n as usize].push_back((ready, d, send));
            self.world.wake_host(n, ready);
            return d.wr_id;
        }
        self.post_now(n, d, send)
    }

    /// Descriptors whose host work is done go into the rings.
    fn post_due(&mut self, n: u16) {
        let layout = self.world.layout;
        while let Some(&(ready, d, send)) = self.pending[n as usize].front() {
            if ready > self.world.now {
                return;
            }
            if !self.ports[n as usize].post(&mut self.world.nodes[n as usize].sram, &layout, &d, send) {
                // Ring full: try again once the NIC consumed some.
                self.world.ring(n);
                self.world.wake_host(n, self.world.now + 1_000);
                return;
            }
            self.pending[n as usize].pop_front();
            self.world.ring(n);
        }
    }

    fn post_now(&mut self, n: u16, d: WorkDesc, send: bool) -> u64 {
        let layout = self.world.layout;
        let mut tries = 0;
        while !self.ports[n as usize].post(&mut self.world.nodes[n as usize].sram, &layout, &d, send) {
            // Ring full: let the NIC consume, as a real host would wait.
            self.world.ring(n);
            self.run_for(1_000);
            tries += 1;
            assert!(tries < 100_000, "ring never drained");
        }
        self.world.ring(n);
        d.wr_id
    }

    /// Bytes a receive delivered.
    pub fn received(&self, wr: u64, len: usize) -> Vec<u8> {
        let (n, off, _) = self.bufs[wr as usize];
        let mut out = vec![0u8; len];
        self.ports[n as usize].data.read(&self.world.nodes[n as usize].mem, off, &mut out);
        out
    }

    /// Writes `data` at `off` of `node`'s data region (the host filling a
    /// buffer a stored send reads).
    pub fn write_data(&mut self, n: u16, off: u64, data: &[u8]) {
        assert!(off + data.len() as u64 <= self.region, "beyond the data region");
        let node = &mut self.world.nodes[n as usize];
        self.ports[n as usize].data.write(&mut node.mem, off, data);
    }

    fn drain(&mut self, n: u16) {
        if self.world.cpu_costs.is_some() {
            return self.drain_per_cpu(n);
        }
        let visible = self.world.nodes[n as usize].host_visible_at;
        if visible > self.world.now {
            // The NIC is still writing (cost model): look when it is done.
            self.world.wake_host(n, visible);
            return;
        }
        let layout = self.world.layout;
        let node = &mut self.world.nodes[n as usize];
        let mut got = Vec::new();
        while let Some(c) = self.ports[n as usize].poll_cq(&mut node.sram, &layout, &node.mem) {
            got.push(c);
        }
        let ns = self.world.cost.host_cqe_ns;
        for c in got {
            let seen = self.host_work(n, ns);
            if seen > self.world.now {
                self.world.wake_host(n, seen);
            }
            self.completions[n as usize].push((c, seen));
        }
    }

    /// [`Cluster::drain`] under the per-CPU cost model: the host takes the
    /// completions whose writes are done by now (port 0's only: the model
    /// tracks one completion queue per node) and looks again when the next is.
    fn drain_per_cpu(&mut self, n: u16) {
        let now = self.world.now;
        let layout = self.world.layout;
        let node = &mut self.world.nodes[n as usize];
        let marks = &mut node.cpus.cqe_done_ps;
        let ready = marks.iter().take_while(|&&t| t.div_ceil(1000) <= now).count();
        if let Some(&next) = marks.get(ready) {
            self.world.wake_host(n, next.div_ceil(1000));
        }
        let node = &mut self.world.nodes[n as usize];
        let mut got = Vec::new();
        for _ in 0..ready {
            let Some(c) = self.ports[n as usize].poll_cq(&mut node.sram, &layout, &node.mem) else { break };
            node.cpus.cqe_done_ps.pop_front();
            got.push(c);
        }
        let ns = self.world.cost.host_cqe_ns;
        for c in got {
            let seen = self.host_work(n, ns);
            if seen > self.world.now {
                self.world.wake_host(n, seen);
            }
            self.completions[n as usize].push((c, seen));
        }
    }

    /// Processes the next event (a NIC's run: its host reaps; a host
    /// wake-up: descriptors it finished writing go to the NIC).
    pub fn step(&mut self) -> Option<Step> {
        let s = self.world.step()?;
        match s {
            Step::Nic(n) => self.drain(n),
            Step::Host(n) => {
                self.post_due(n);
                self.drain(n);
            }
        }
        Some(s)
    }

    /// Takes the completions `node`'s host has finished reaping by now,
    /// with the time it finished each.
    pub fn take_ready(&mut self, n: u16) -> Vec<(Cqe, u64)> {
        let now = self.world.now;
        let all = core::mem::take(&mut self.completions[n as usize]);
        let (ready, later): (Vec<_>, Vec<_>) = all.into_iter().partition(|&(_, seen)| seen <= now);
        self.completions[n as usize] = later;
        ready
    }

    /// When `node`'s host is next free (cost model).
    pub fn host_free_at(&self, n: u16) -> u64 {
        self.host_free_at[n as usize].max(self.world.now)
    }

    /// Runs until virtual time `now + ns` (or no event is left).
    pub fn run_for(&mut self, ns: u64) {
        let end = self.world.now + ns;
        while self.world.next_at().is_some_and(|t| t <= end) {
            self.step();
        }
        self.world.now = self.world.now.max(end);
    }

    /// Takes the completions `node` has seen so far.
    pub fn completions(&mut self, n: u16) -> Vec<Cqe> {
        core::mem::take(&mut self.completions[n as usize]).into_iter().map(|(c, _)| c).collect()
    }

    /// Runs until `node` has a completion for `wr` (at most `limit_ns`).
    pub fn wait(&mut self, n: u16, wr: u64, limit_ns: u64) -> Option<Cqe> {
        self.wait_seen(n, wr, limit_ns).map(|(c, _)| c)
    }

    /// As [`Cluster::wait`], also returning when the host finished reaping it.
    pub fn wait_seen(&mut self, n: u16, wr: u64, limit_ns: u64) -> Option<(Cqe, u64)> {
        let end = self.world.now + limit_ns;
        loop {
            let now = self.world.now;
            if let Some(i) = self.completions[n as usize].iter().position(|&(c, seen)| c.wr_id == wr && seen <= now) {
                return Some(self.completions[n as usize].remove(i));
            }
            if self.world.next_at().is_none_or(|t| t > end) {
                return None;
            }
            self.step();
        }
    }

    /// Registers `len` fresh bytes of `node`'s data region a second time,
    /// page-aligned, with `access` for port 0; returns the key.
    pub fn reg_mr(&mut self, n: u16, len: u64, access: u8) -> u32 {
        let page = PAGE_SIZE as u64;
        let off = self.alloc(n, len + page).next_multiple_of(page);
        let data = &self.ports[n as usize].data;
        let first = (off / page) as usize;
        let pages = data.pages[first..first + len.div_ceil(page).max(1) as usize].to_vec();
        let slot = EXTRA_MR_SLOT + self.extra.len() as u32;
        let secret = (self.rng.next_u64() as u32).max(1);
        let region = Region { key: (0x33 << 16) | slot, secret, len, pages };
        let layout = self.world.layout;
        let node = &mut self.world.nodes[n as usize];
        let e = mr_entry(&region, 0, access, &mut node.mem, &mut self.rng);
        Sram(&mut node.sram).put(layout.mr_entry(slot as usize), &e);
        let key = region.key;
        self.extra.push((n, region));
        key
    }

    /// The remote-access secret of `node`'s region `key` (from
    /// [`Cluster::reg_mr`]); 0 for a key it never registered.
    pub fn secret(&self, n: u16, key: u32) -> u32 {
        self.extra.iter().find(|(m, r)| *m == n && r.key == key).map_or(0, |(_, r)| r.secret)
    }

    fn extra_region(&self, n: u16, key: u32) -> &Region {
        &self.extra.iter().find(|(m, r)| *m == n && r.key == key).expect("a key from reg_mr").1
    }

    /// Reads the little-endian word of `width` bytes at `off` of region `key` (from [`Cluster::reg_mr`]).
    pub fn read_word(&self, n: u16, key: u32, off: u64, width: u32) -> u64 {
        let mut b = [0u8; 8];
        self.extra_region(n, key).read(&self.world.nodes[n as usize].mem, off, &mut b[..width as usize]);
        u64::from_le_bytes(b)
    }

    /// Writes a word as the host CPU would.
    pub fn write_word(&mut self, n: u16, key: u32, off: u64, width: u32, v: u64) {
        let r = self.extra_region(n, key).clone();
        r.write(&mut self.world.nodes[n as usize].mem, off, &v.to_le_bytes()[..width as usize]);
    }

    /// Posts a remote atomic from `node` to (`dst`, port 0) on the word
    /// `(key, offset, width)` with the key's own secret; `operand` is the
    /// addend / new value, `compare` the CAS compare value (0 otherwise).
    /// Its result word is read with [`Cluster::received`]`(wr, width)`.
    /// Returns the wr_id.
    pub fn atomic(&mut self, n: u16, op: Opcode, dst: u16, at: (u32, u64, u32), operand: u64, compare: u64) -> u64 {
        let secret = self.secret(dst, at.0);
        self.atomic_with_secret(n, op, dst, at, secret, operand, compare)
    }

    /// [`Cluster::atomic`] presenting `secret` with the key (a guesser).
    #[allow(clippy::too_many_arguments)]
    pub fn atomic_with_secret(
        &mut self,
        n: u16,
        op: Opcode,
        dst: u16,
        at: (u32, u64, u32),
        secret: u32,
        operand: u64,
        compare: u64,
    ) -> u64 {
        let (key, offset, width) = at;
        let off = self.alloc(n, 8);
        let wr = self.bufs.len() as u64;
        let mut d = WorkDesc {
            wr_id: wr,
            opcode: op as u8,
            flags: WD_SIGNALED,
            num_sge: 2,
            node: dst,
            port: 0,
            tag: operand,
            ignore: compare,
            ..Default::default()
        };
        d.sge[0] = Sge { key: self.ports[n as usize].data.key, len: width, offset: off };
        d.sge[1] = RemoteSge { key, secret, offset }.to_sge();
        self.bufs.push((n, off, width as u64));
        self.post_desc(n, d, true)
    }

    /// Copies `data` into `node`'s region `key` (from [`Cluster::reg_mr`]) at `off`, as its host CPU would.
    pub fn write_region(&mut self, n: u16, key: u32, off: u64, data: &[u8]) {
        let r = self.extra_region(n, key).clone();
        r.write(&mut self.world.nodes[n as usize].mem, off, data);
    }

    /// `len` bytes of `node`'s region `key` at `off`.
    pub fn read_region(&self, n: u16, key: u32, off: u64, len: usize) -> Vec<u8> {
        let mut b = vec![0u8; len];
        self.extra_region(n, key).read(&self.world.nodes[n as usize].mem, off, &mut b);
        b
    }

    /// Posts a remote write of `data` from `node` to (`dst`, port 0) at
    /// `remote` = (key, secret, offset); with `imm`, immediate data for a
    /// receive at the target. Returns the wr_id.
    pub fn rma_write(&mut self, n: u16, dst: u16, data: &[u8], remote: (u32, u32, u64), imm: Option<u64>) -> u64 {
        let off = self.alloc(n, data.len() as u64);
        let node = &mut self.world.nodes[n as usize];
        self.ports[n as usize].data.write(&mut node.mem, off, data);
        let local = Sge { key: self.ports[n as usize].data.key, len: data.len() as u32, offset: off };
        let d = rma_desc(Opcode::RdmaWrite, dst, local, remote, imm);
        self.bufs.push((n, off, data.len() as u64));
        self.post_desc_copy(n, WorkDesc { wr_id: self.bufs.len() as u64 - 1, ..d }, true, 0)
    }

    /// Posts a remote read of `len` bytes at `remote` = (key, secret,
    /// offset) of (`dst`, port 0) into fresh local memory of `node`, read
    /// back with [`Cluster::received`]. Returns the wr_id.
    pub fn rma_read(&mut self, n: u16, dst: u16, len: u64, remote: (u32, u32, u64)) -> u64 {
        let off = self.alloc(n, len);
        let local = Sge { key: self.ports[n as usize].data.key, len: len as u32, offset: off };
        let d = rma_desc(Opcode::RdmaRead, dst, local, remote, None);
        self.bufs.push((n, off, len));
        self.post_desc_copy(n, WorkDesc { wr_id: self.bufs.len() as u64 - 1, ..d }, true, 0)
    }

    /// Closes and re-opens port 0 of `node` (a new process: a new port
    /// generation, sequence numbers from 0), keeping its registrations.
    pub fn reopen_port(&mut self, n: u16) {
        self.reopen_port_mode(n, emp_uapi::sram::match_mode::DEFAULT);
    }

    /// As [`Cluster::reopen_port`], the port opening in matching mode
    /// `mode` (`emp_uapi::sram::match_mode`).
    pub fn reopen_port_mode(&mut self, n: u16, mode: u64) {
        assert_eq!(self.close_port(n), Some(ar::OK));
        let layout = self.world.layout;
        let hp = &mut self.ports[n as usize];
        let node = &mut self.world.nodes[n as usize];
        hp.cq.write(&mut node.mem, 0, &vec![0u8; CQ_ENTRIES as usize * Cqe::SIZE]);
        (hp.cq_head, hp.send_prod, hp.recv_prod) = (0, 0, 0);
        reset_port_ctl(&mut node.sram, &layout, 0);
        admin_post(&mut node.sram, &layout, AdminOp::PortOpen, [0, hp.cq.key as u64, 0, CQ_ENTRIES as u64, mode, 0]);
        self.world.doorbell_now(n);
        assert_eq!(admin_result(&mut self.world.nodes[n as usize].sram, &layout), Some(ar::OK));
    }

    /// A NIC counter of `node`.
    pub fn counter(&self, n: u16, c: usize) -> u64 {
        self.world.nodes[n as usize].nic.counters()[c]
    }

    /// Loads group `id`/`epoch` over `members` (nodes, port 0) with `trees`
    /// (parent arrays over relative ranks) into group slot `slot` of every
    /// member's NIC; returns each member's admin result.
    pub fn create_group(&mut self, slot: u32, id: u32, epoch: u32, members: &[u16], trees: &[Vec<u8>]) -> Vec<u32> {
        self.create_group_wide(slot, id, epoch, members, &widen(trees))
    }

    /// As [`Cluster::create_group`] with wide (16-bit) parent arrays, for
    /// groups of any size up to `GROUP_MEMBERS_MAX`: a group of more than
    /// 64 takes `GroupEntry::span` slots from `slot` on.
    pub fn create_group_wide(
        &mut self,
        slot: u32,
        id: u32,
        epoch: u32,
        members: &[u16],
        trees: &[Vec<u16>],
    ) -> Vec<u32> {
        let mut encoded = group_encoding(id, epoch, members, 0, trees);
        members
            .iter()
            .enumerate()
            .map(|(rank, &n)| {
                set_rank(&mut encoded, rank as u16);
                self.set_group_bytes(n, slot, &encoded)
            })
            .collect()
    }

    /// As [`Cluster::create_group`], with `bounce_slots` bounce slots of
    /// `bounce_size` bytes per member (application-bypass broadcasts).
    #[allow(clippy::too_many_arguments)]
    pub fn create_group_bounce(
        &mut self,
        slot: u32,
        id: u32,
        epoch: u32,
        members: &[u16],
        trees: &[Vec<u8>],
        bounce_slots: u16,
        bounce_size: u32,
    ) -> Vec<u32> {
        self.create_group_bounce_wide(slot, id, epoch, members, &widen(trees), bounce_slots, bounce_size)
    }

    /// As [`Cluster::create_group_bounce`] with wide parent arrays (groups
    /// of any size).
    #[allow(clippy::too_many_arguments)]
    pub fn create_group_bounce_wide(
        &mut self,
        slot: u32,
        id: u32,
        epoch: u32,
        members: &[u16],
        trees: &[Vec<u16>],
        bounce_slots: u16,
        bounce_size: u32,
    ) -> Vec<u32> {
        let mut out = Vec::new();
        let mut encoded = group_encoding(id, epoch, members, 0, trees);
        for (rank, &n) in members.iter().enumerate() {
            let mut e = GroupEntry::get(&encoded);
            e.my_rank = rank as u16;
            e.bounce_slots = bounce_slots;
            e.bounce_slot_size = bounce_size;
            e.bounce_key = self.ports[n as usize].data.key;
            e.bounce_offset = self.alloc(n, bounce_slots as u64 * bounce_size as u64);
            e.put(&mut encoded[..GroupEntry::SIZE]);
            out.push(self.set_group_bytes(n, slot, &encoded));
        }
        out
    }

    /// Posts a broadcast on group slot `slot` from `root` over tree `tree`:
    /// the root sends `data`, the others receive `data.len()` bytes (read
    /// with [`Cluster::received`]). Returns the wr_id.
    pub fn bcast(&mut self, n: u16, slot: u32, root: u16, tree: u8, data: &[u8], is_root: bool) -> u64 {
        let len = data.len() as u64;
        let off = self.alloc(n, len);
        if is_root {
            let node = &mut self.world.nodes[n as usize];
            self.ports[n as usize].data.write(&mut node.mem, off, data);
        }
        let key = self.ports[n as usize].data.key;
        let mut d = work_desc(Opcode::Bcast as u8, 0, slot as u16, root, tree as u64, 0, key, off, len, 2);
        if len == 0 {
            d.num_sge = 0;
            d.sge[0] = Default::default();
        }
        let wr = self.bufs.len() as u64;
        d.wr_id = wr;
        self.bufs.push((n, off, len));
        self.post(n, d, true, if is_root { len } else { 0 });
        wr
    }

    /// Posts a reliable broadcast (seed 002) on group slot `slot` from
    /// `root` with algorithm `algo` (`emp_uapi::coll::rbcast_tag`): the
    /// root sends `data`, the others receive `data.len()` bytes into a
    /// fresh buffer (read with [`Cluster::received`]). Returns the wr_id.
    pub fn rbcast(&mut self, n: u16, slot: u32, root: u16, algo: u64, data: &[u8], is_root: bool) -> u64 {
        let len = data.len() as u64;
        let off = self.alloc(n, len);
        if is_root {
            let node = &mut self.world.nodes[n as usize];
            self.ports[n as usize].data.write(&mut node.mem, off, data);
        }
        let key = self.ports[n as usize].data.key;
        let mut d = work_desc(Opcode::Rbcast as u8, 0, slot as u16, root, algo, 0, key, off, len, 2);
        if len == 0 {
            d.num_sge = 0;
            d.sge[0] = Default::default();
        }
        let wr = self.bufs.len() as u64;
        d.wr_id = wr;
        self.bufs.push((n, off, len));
        self.post(n, d, true, if is_root { len } else { 0 });
        wr
    }

    /// Posts a multisend of `data` with `tag` from `node` to the group
    /// ranks in `mask`; returns its wr_id.
    pub fn multisend(&mut self, n: u16, slot: u32, mask: u64, tag: u64, data: &[u8]) -> u64 {
        self.multisend_window(n, slot, 0, mask, tag, data)
    }

    /// As [`Cluster::multisend`] to the ranks of 64-rank window `window`:
    /// bit i of `mask` is rank 64 · `window` + i.
    pub fn multisend_window(&mut self, n: u16, slot: u32, window: u16, mask: u64, tag: u64, data: &[u8]) -> u64 {
        let len = data.len() as u64;
        let off = self.alloc(n, len);
        let node = &mut self.world.nodes[n as usize];
        self.ports[n as usize].data.write(&mut node.mem, off, data);
        let key = self.ports[n as usize].data.key;
        let mut d = work_desc(Opcode::MultiSend as u8, 0, slot as u16, window, tag, mask, key, off, len, 3);
        d.wr_id = self.bufs.len() as u64;
        self.post(n, d, true, len)
    }

    /// Frames `node`'s NIC sent with their payload straight from host
    /// memory (Immediate Sending).
    pub fn frames_sent_from_host(&self, n: u16) -> u64 {
        self.world.nodes[n as usize].mem.frames_sent_from_host
    }

    /// Bytes `node`'s NIC has read from host memory by DMA.
    pub fn dma_read_bytes(&self, n: u16) -> u64 {
        self.world.nodes[n as usize].mem.dma_read_bytes
    }

    /// Writes `entry` into group slot `slot` of `node` and loads it.
    pub fn set_group(&mut self, n: u16, slot: u32, entry: &GroupEntry) -> u32 {
        let mut b = [0u8; GroupEntry::SIZE];
        entry.put(&mut b);
        self.set_group_bytes(n, slot, &b)
    }

    /// Writes an encoded group (entry, then any body: [`group_encoding`])
    /// into group slots `slot ..` of `node` and loads it. Bytes past the
    /// table's end are not written (the NIC refuses such a group).
    pub fn set_group_bytes(&mut self, n: u16, slot: u32, encoded: &[u8]) -> u32 {
        let layout = self.world.layout;
        let sram = &mut self.world.nodes[n as usize].sram;
        let room = (layout.params.group_entries as usize).saturating_sub(slot as usize) * GroupEntry::SIZE;
        let at = layout.group_entry(slot as usize);
        let len = encoded.len().min(room);
        sram[at..at + len].copy_from_slice(&encoded[..len]);
        admin_post(sram, &layout, AdminOp::GroupSet, [slot as u64, 0, 0, 0, 0, 0]);
        self.world.doorbell_now(n);
        self.drain(n);
        let r = admin_result(&mut self.world.nodes[n as usize].sram, &layout).unwrap_or(u32::MAX);
        if r == ar::OK && !self.group_slots[n as usize].contains(&slot) {
            self.group_slots[n as usize].push(slot);
        }
        r
    }

    /// Retires group slot `slot` on `node`.
    pub fn clear_group(&mut self, n: u16, slot: u32) -> u32 {
        let layout = self.world.layout;
        let sram = &mut self.world.nodes[n as usize].sram;
        admin_post(sram, &layout, AdminOp::GroupClear, [slot as u64, 0, 0, 0, 0, 0]);
        self.world.doorbell_now(n);
        self.drain(n);
        admin_result(&mut self.world.nodes[n as usize].sram, &layout).unwrap_or(u32::MAX)
    }

    /// Posts a barrier on group slot `slot`; returns its wr_id.
    pub fn barrier(&mut self, n: u16, slot: u32, algo: BarrierAlgo, tree: u8) -> u64 {
        let d = WorkDesc {
            opcode: Opcode::Barrier as u8,
            flags: emp_uapi::desc::WD_SIGNALED,
            node: slot as u16,
            port: algo as u16,
            tag: tree as u64,
            ..Default::default()
        };
        self.post_raw(n, d, true)
    }

    /// Posts a reduce (to `root`) or, with `all`, an allreduce of `input`
    /// (`count` elements of `dtype`); returns its wr_id. The result (root or
    /// everyone) is read with [`Cluster::received`].
    #[allow(clippy::too_many_arguments)]
    pub fn reduce(
        &mut self,
        n: u16,
        slot: u32,
        all: bool,
        root: u16,
        dtype: Dtype,
        op: ReduceOp,
        tree: u8,
        input: &[u8],
    ) -> u64 {
        let len = input.len() as u64;
        let inp = self.alloc(n, len);
        let out = self.alloc(n, len);
        let node = &mut self.world.nodes[n as usize];
        self.ports[n as usize].data.write(&mut node.mem, inp, input);
        let key = self.ports[n as usize].data.key;
        let mut d = WorkDesc {
            opcode: if all { Opcode::Allreduce } else { Opcode::Reduce } as u8,
            flags: emp_uapi::desc::WD_SIGNALED,
            node: slot as u16,
            port: if all { 0 } else { root },
            tag: reduce_tag(dtype, op, tree),
            ignore: len / dtype.size() as u64,
            num_sge: 2,
            ..Default::default()
        };
        d.sge[0] = emp_uapi::desc::Sge { key, len: len as u32, offset: inp };
        d.sge[1] = emp_uapi::desc::Sge { key, len: len as u32, offset: out };
        let wr = self.bufs.len() as u64;
        d.wr_id = wr;
        self.bufs.push((n, out, len));
        self.post(n, d, true, len);
        wr
    }

    /// Runs until every listed (node, wr) completed or `limit_ns` passed;
    /// returns the completions in the same order.
    pub fn wait_all(&mut self, wrs: &[(u16, u64)], limit_ns: u64) -> Vec<Option<Cqe>> {
        wrs.iter().map(|&(n, wr)| self.wait(n, wr, limit_ns)).collect()
    }
}

/// A group table entry for `members` (nodes, port 0, at most 64) as rank
/// `rank` sees it.
pub fn group_entry(id: u32, epoch: u32, members: &[u16], rank: u16, trees: &[Vec<u8>]) -> GroupEntry {
    let mut e = GroupEntry {
        group_id: id,
        epoch,
        member_count: members.len() as u16,
        my_rank: rank,
        port: 0,
        tree_count: trees.len() as u8,
        ..Default::default()
    };
    for (i, &m) in members.iter().enumerate().take(GROUP_INLINE_MAX) {
        e.members[i] = (m as u32) << 16;
    }
    for (t, parents) in trees.iter().enumerate() {
        e.parents[64 * t..64 * t + parents.len()].copy_from_slice(parents);
    }
    e
}

/// The binomial tree over `n` relative ranks (the root sends to 1, 2, 4, …):
/// the parent of r is r without its highest set bit.
pub fn binomial_parents(n: usize) -> Vec<u8> {
    (0..n).map(|r| if r == 0 { TREE_ROOT } else { (r - (1 << (usize::BITS - 1 - r.leading_zeros()))) as u8 }).collect()
}

/// [`binomial_parents`] in the wide form, for groups of any size.
pub fn binomial_parents_wide(n: usize) -> Vec<u16> {
    (0..n).map(|r| if r == 0 { TREE_ROOT_WIDE } else { (r - (1 << r.ilog2())) as u16 }).collect()
}

/// Parent arrays in the wide form ([`TREE_ROOT`] becomes [`TREE_ROOT_WIDE`]).
pub fn widen(trees: &[Vec<u8>]) -> Vec<Vec<u16>> {
    trees.iter().map(|t| t.iter().map(|&p| if p == TREE_ROOT { TREE_ROOT_WIDE } else { p as u16 }).collect()).collect()
}

/// The bytes the trusted side writes for a group of `members` (nodes,
/// port 0) as rank `rank` sees it: the entry alone for up to 64 members
/// (parents narrowed to bytes), else the entry and its body padded to
/// whole entries (`GroupEntry::span` of them).
pub fn group_encoding(id: u32, epoch: u32, members: &[u16], rank: u16, trees: &[Vec<u16>]) -> Vec<u8> {
    let n = members.len();
    let mut e = GroupEntry {
        group_id: id,
        epoch,
        member_count: n as u16,
        my_rank: rank,
        port: 0,
        tree_count: trees.len() as u8,
        ..Default::default()
    };
    let mut out = vec![0u8; e.span() * GroupEntry::SIZE];
    if !e.is_wide() {
        for (i, &m) in members.iter().enumerate() {
            e.members[i] = (m as u32) << 16;
        }
        for (t, parents) in trees.iter().enumerate() {
            for (r, &p) in parents.iter().enumerate().take(GROUP_INLINE_MAX) {
                e.parents[64 * t + r] = if p == TREE_ROOT_WIDE { TREE_ROOT } else { p as u8 };
            }
        }
    } else {
        let body = &mut out[GroupEntry::SIZE..];
        for (i, &m) in members.iter().enumerate() {
            body[4 * i..4 * i + 4].copy_from_slice(&((m as u32) << 16).to_le_bytes());
        }
        for (t, parents) in trees.iter().enumerate() {
            for (r, &p) in parents.iter().enumerate().take(n) {
                let at = 4 * n + 2 * (t * n + r);
                body[at..at + 2].copy_from_slice(&p.to_le_bytes());
            }
        }
    }
    e.put(&mut out[..GroupEntry::SIZE]);
    out
}

/// Sets the rank an encoded group's entry names.
fn set_rank(encoded: &mut [u8], rank: u16) {
    let mut e = GroupEntry::get(encoded);
    e.my_rank = rank;
    e.put(&mut encoded[..GroupEntry::SIZE]);
}

/// A remote write or read descriptor: `local`, then the remote end.
fn rma_desc(op: Opcode, dst: u16, local: Sge, remote: (u32, u32, u64), imm: Option<u64>) -> WorkDesc {
    let (key, secret, offset) = remote;
    let mut d = WorkDesc {
        opcode: op as u8,
        flags: WD_SIGNALED | if imm.is_some() { WD_IMM } else { 0 },
        num_sge: 2,
        node: dst,
        port: 0,
        tag: imm.unwrap_or(0),
        ..Default::default()
    };
    d.sge[0] = local;
    d.sge[1] = RemoteSge { key, secret, offset }.to_sge();
    d
}
