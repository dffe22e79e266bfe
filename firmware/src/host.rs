//! The host interface: admin mailbox, descriptor rings, completions.
//!
//! Rings and the admin mailbox live in SRAM; completions are DMA-written to
//! the port's completion queue in host memory (a region the port registered).
//! A descriptor is consumed only when the CQ has room for its completion, so
//! the CQ can never overflow.

use emp_uapi::desc::{Cqe, Opcode, Status, WorkDesc, MR_LOCAL_READ, MR_LOCAL_WRITE, START_BYTES, WD_PERSIST};
use emp_uapi::ring;
use emp_uapi::sram::{admin_result, ctl, port_state, AdminMailbox, AdminOp, RouteEntry};
use emp_uapi::{sram::counter, DecodeError, Le};

use emp_uapi::sram::Layout;

use crate::cq::{Completer, Completion};
use crate::recv_cpu::RecvCpu;
use crate::send_cpu::SendCpu;
use crate::{persist, sram_put_u32, sram_u32, Hal, LocalDesc, Nic};

/// A descriptor taken from a ring, to run: a posted descriptor with its
/// validation, or a started one (validated when stored).
type RingRun = (WorkDesc, Result<Opcode, DecodeError>);

/// What the send side stops at in a send ring ([`SendCpu::take_sends`]):
/// the whole program goes on from there.
pub(crate) enum RingStop {
    /// The next descriptor is not a plain send (a collective, an atomic, a
    /// remote access, a receive on the wrong ring): not taken.
    Program,
    /// A send taken and checked, to a peer the table holds no entry for
    /// yet (`Nic::send_to_new_peer`).
    NewPeer(LocalDesc),
}

/// Resolves a descriptor just taken from a ring whose persistent
/// descriptors are `stored`: a start becomes the descriptor stored in its
/// slot, with the start's `wr_id`; a store is kept. `Err`: nothing to run,
/// only the completion to report — a store's, unsignaled (it reports only a
/// failure), or a bad descriptor's: a start of an empty slot, a store of
/// the other ring's kind.
fn ring_desc(stored: &mut persist::PersistTable, send: bool, d: &WorkDesc) -> Result<RingRun, Completion> {
    let own = if send { Opcode::Send } else { Opcode::Recv };
    let v = d.validate();
    match v {
        Ok(Opcode::Start) => match stored.get(d.tag) {
            Some(s) => Ok((WorkDesc { wr_id: d.wr_id, ..*s }, Ok(own))),
            None => Err(Completion::bad_descriptor(&LocalDesc::new(d), Opcode::Start)),
        },
        Ok(op) if d.flags & WD_PERSIST != 0 => {
            let ld = LocalDesc::new(d);
            if op != own {
                return Err(Completion::bad_descriptor(&ld, op));
            }
            stored.store(d.slot, d);
            Err(Completion { signaled: false, ..Completion::of(&ld, op, Status::Success) })
        }
        _ => Ok((*d, v)),
    }
}

/// Copies the next descriptor out of `port`'s send (or receive) ring, at
/// consumer index `cons` (advanced), and reserves CQ room for it
/// (`outstanding`). A start is read through its `tag` alone (`persist.rs`).
fn take_desc<H: Hal>(
    hal: &mut H,
    layout: &Layout,
    port: u16,
    send: bool,
    cons: &mut u32,
    outstanding: &mut u32,
) -> WorkDesc {
    let off = layout.port(port).ring_slot(send, *cons);
    *cons = cons.wrapping_add(1);
    *outstanding += 1;
    let mut b = [0u8; WorkDesc::SIZE];
    let (head, rest) = b.split_at_mut(START_BYTES);
    hal.sram_read(off, head);
    if head[core::mem::offset_of!(WorkDesc, opcode)] != Opcode::Start as u8 {
        hal.sram_read(off + START_BYTES, rest);
    }
    // A consumed slot is left zero, before the consumer index (or a
    // completion) frees it: a slot past the producer index then holds
    // only what the host wrote and has not published, and a context
    // switch carries just that (`ctxsw.rs`, unpublished slots).
    hal.sram_write(off, &[0u8; WorkDesc::SIZE]);
    WorkDesc::get(&b)
}

impl Nic {
    /// The persistent descriptors of `port`'s send (or receive) ring.
    pub(crate) fn stored_mut(&mut self, port: u16, send: bool) -> &mut persist::PersistTable {
        if send {
            &mut self.send.ports[port as usize].stored
        } else {
            &mut self.recv.ports[port as usize].stored
        }
    }

    /// Forgets both rings' persistent descriptors of `port` (its job left).
    pub(crate) fn forget_stored(&mut self, port: u16) {
        self.send.ports[port as usize].stored.clear();
        self.recv.ports[port as usize].stored.clear();
    }

    /// Executes a pending admin command, if any.
    pub(crate) fn service_admin<H: Hal>(&mut self, hal: &mut H, now: u64) {
        let Some(mb) = admin_request(hal, &self.layout) else { return };
        let off = self.layout.admin_off as usize;
        self.whole = true;
        let result = match AdminOp::from_u32(mb.op) {
            Some(AdminOp::Nop) => admin_result::OK,
            Some(AdminOp::PortOpen) => self.port_open(hal, &mb.args),
            Some(AdminOp::PortClose) => self.admin_port_close(hal, now, mb.args[0]),
            Some(AdminOp::MrFence) => {
                if mb.args[0] < self.layout.params.mr_entries as u64 {
                    // Jobs name host memory by the translations of when
                    // they were queued: none may outlive the fence.
                    self.drain_jobs(hal);
                    self.mr.invalidate(mb.args[0] as usize);
                    admin_result::OK
                } else {
                    admin_result::BAD_ARG
                }
            }
            Some(AdminOp::GroupSet) => self.admin_group_set(hal, now, mb.args[0]),
            Some(AdminOp::GroupClear) => self.admin_group_clear(hal, now, mb.args[0]),
            Some(AdminOp::PortSuspend) => self.admin_port_suspend(hal, mb.args[0]),
            Some(AdminOp::PortStable) => self.admin_port_stable(mb.args[0]),
            Some(AdminOp::PortSave) => self.admin_port_save(hal, now, &mb.args),
            Some(AdminOp::PortRestore) => self.admin_port_restore(hal, now, &mb.args),
            Some(AdminOp::PortResume) => self.admin_port_resume(hal, mb.args[0]),
            Some(AdminOp::PortDiscard) => self.admin_port_discard(mb.args[0]),
            None => admin_result::BAD_OP,
        };
        sram_put_u32(hal, off + core::mem::offset_of!(AdminMailbox, result), result);
        sram_put_u32(hal, off + core::mem::offset_of!(AdminMailbox, done_seq), mb.request_seq);
        hal.raise_interrupt(0);
    }

    fn port_open<H: Hal>(&mut self, hal: &mut H, args: &[u64; 6]) -> u32 {
        let (port, cq_key, cq_offset, cq_entries) = (args[0], args[1], args[2], args[3]);
        if port >= self.ports.len() as u64 || cq_key > u32::MAX as u64 {
            return admin_result::BAD_ARG;
        }
        let Some(mode) = crate::MatchMode::from_arg(args[4], self.cfg.matching) else {
            return admin_result::BAD_ARG;
        };
        if cq_entries > 1 << 20 || !ring::valid_entries(cq_entries as u32) {
            return admin_result::BAD_ARG;
        }
        let p = port as u16;
        if self.ports[p as usize].open {
            return admin_result::BAD_STATE;
        }
        let Some(addr) = self.open_addr(p, args[5]) else {
            return admin_result::BAD_STATE;
        };
        let cq_bytes = cq_entries * Cqe::SIZE as u64;
        if self.mr_lookup(hal, p, cq_key as u32, cq_offset, cq_bytes, MR_LOCAL_WRITE).is_err() {
            return admin_result::BAD_KEY;
        }
        let w = self.layout.port(p);
        let gen = {
            let st = &mut self.ports[p as usize];
            st.gen = st.gen.wrapping_add(1).max(1);
            st.open = true;
            st.cq_key = cq_key as u32;
            st.cq_offset = cq_offset;
            st.cq_entries = cq_entries as u32;
            st.mode = mode;
            st.addr = addr;
            st.suspended = false;
            st.gen
        };
        let cq = &mut self.cqs.ports[p as usize];
        (cq.prod, cq.outstanding) = (0, 0);
        // Nothing stored by an earlier job in this slot runs.
        self.forget_stored(p);
        // The trusted side zeroed the host-written words before opening.
        let (sc, rc) = (sram_u32(hal, w.ctl(ctl::SEND_PROD)), sram_u32(hal, w.ctl(ctl::RECV_PROD)));
        self.send.ports[p as usize].cons = sc;
        self.recv.ports[p as usize].cons = rc;
        // The slot's last job may have left descriptors it never published:
        // nothing of them is this job's to read (or to carry in an image).
        let zero = [0u8; emp_uapi::desc::WorkDesc::SIZE];
        for (send, entries) in [(true, w.send_entries), (false, w.recv_entries)] {
            for k in 0..entries {
                hal.sram_write(w.ring_slot(send, k), &zero);
            }
        }
        sram_put_u32(hal, w.ctl(ctl::SEND_CONS), sc);
        sram_put_u32(hal, w.ctl(ctl::RECV_CONS), rc);
        sram_put_u32(hal, w.ctl(ctl::CQ_PROD), 0);
        sram_put_u32(hal, w.ctl(ctl::CQ_OVERRUNS), 0);
        sram_put_u32(hal, w.ctl(ctl::GEN), gen as u32);
        sram_put_u32(hal, w.ctl(ctl::STATE), port_state::OPEN);
        admin_result::OK
    }

    fn admin_port_close<H: Hal>(&mut self, hal: &mut H, now: u64, port: u64) -> u32 {
        if port >= self.ports.len() as u64 {
            return admin_result::BAD_ARG;
        }
        if !self.ports[port as usize].open {
            return admin_result::BAD_STATE;
        }
        self.port_close(hal, now, port as u16);
        admin_result::OK
    }

    /// Closes a port: everything outstanding completes `Flushed` (best
    /// effort: the process may be gone), every table entry is freed.
    pub(crate) fn port_close<H: Hal>(&mut self, hal: &mut H, now: u64, port: u16) {
        // Jobs name the port's memory (a completion's CQ slot): none may
        // outlive the port.
        self.drain_jobs(hal);
        // What was delivered, before anything half received is flushed.
        self.linger_port(now, port);
        // Collectives first: their internal messages are flushed with them.
        self.groups_of_port_remove(hal, now, port);
        let peers: Vec<u32> = (0..self.peers.len() as u32)
            .filter(|&i| self.peers[i as usize].as_ref().is_some_and(|p| p.port == port))
            .collect();
        for i in peers {
            // Messages already delivered keep their ACK: owed but unsent
            // (coalescing), the sender would retransmit into a closed port
            // and fail a send that in fact arrived.
            self.recv_cpu().flush_ack(hal, i);
            while let Some(&slot) = self.send.peer(i).tx_queue.front() {
                self.finish_tx(hal, now, slot, Status::Flushed);
            }
            while let Some(&slot) = self.recv.peer(i).rx_active.first() {
                self.finish_rx(hal, now, slot, Some(Status::Flushed));
            }
        }
        while let Some(d) = self.recv.ports[port as usize].posted.pop_front() {
            self.complete(hal, port, Completion::of(&d, Opcode::Recv, Status::Flushed));
        }
        self.atomic_flush_port(hal, port);
        self.rma_flush_port(hal, port);
        self.unexp_flush_port(port);
        self.free_peers_of(port);
        self.mcast_leave_all(hal, port);
        debug_assert_eq!(self.cqs.ports[port as usize].outstanding, 0);
        let st = &mut self.ports[port as usize];
        st.open = false;
        st.suspended = false;
        st.addr = port;
        self.forget_stored(port);
        let w = self.layout.port(port);
        sram_put_u32(hal, w.ctl(ctl::STATE), port_state::CLOSED);
    }

    /// Consumes new descriptors from a port's rings.
    pub(crate) fn consume_rings<H: Hal>(&mut self, hal: &mut H, now: u64, port: u16) {
        let w = self.layout.port(port);
        let (rc0, sc0) = (self.recv.ports[port as usize].cons, self.send.ports[port as usize].cons);
        let mut cq_cons = None;
        // Receives are the receive side's; it stops while retained headers
        // wait (a receive may start a pull).
        let mut budget = w.recv_entries;
        while self.recv_cpu().take_recvs(hal, port, &mut budget, &mut cq_cons) {
            self.whole = true;
            if !self.take_recv_program(hal, now, port, &mut cq_cons) {
                break;
            }
            budget -= 1;
        }
        // Written only when moved: the host polls these words' cache line.
        let rc = self.recv.ports[port as usize].cons;
        if rc != rc0 {
            sram_put_u32(hal, w.ctl(ctl::RECV_CONS), rc);
        }

        // Plain sends are the send side's; it stops where the next
        // descriptor needs the whole program.
        let mut budget = w.send_entries;
        loop {
            match self.send_cpu().take_sends(hal, now, port, &mut budget, &mut cq_cons) {
                None => break,
                Some(RingStop::NewPeer(ld)) => {
                    self.whole = true;
                    self.send_to_new_peer(hal, now, port, ld);
                }
                Some(RingStop::Program) => {
                    self.whole = true;
                    if !self.take_send_program(hal, now, port) {
                        break;
                    }
                    budget -= 1;
                }
            }
        }
        let sc = self.send.ports[port as usize].cons;
        if sc != sc0 {
            sram_put_u32(hal, w.ctl(ctl::SEND_CONS), sc);
        }
    }

    /// A descriptor taken from one of `port`'s rings ([`ring_desc`]):
    /// what there is to run, or `None` when it was stored or refused (and
    /// reported).
    fn ring_desc<H: Hal>(&mut self, hal: &mut H, port: u16, send: bool, d: &WorkDesc) -> Option<RingRun> {
        ring_desc(self.stored_mut(port, send), send, d).map_err(|c| self.refuse(hal, port, c)).ok()
    }

    /// Copies the next descriptor out of a ring ([`take_desc`]).
    fn take_desc<H: Hal>(&mut self, hal: &mut H, port: u16, send: bool) -> WorkDesc {
        let cons =
            if send { &mut self.send.ports[port as usize].cons } else { &mut self.recv.ports[port as usize].cons };
        take_desc(hal, &self.layout, port, send, cons, &mut self.cqs.ports[port as usize].outstanding)
    }

    /// The receive ring's next descriptor, which the receive side stopped
    /// at (retained headers wait): posted unless the posted table is full,
    /// or a pull it may start has no read or send record; `false` then.
    fn take_recv_program<H: Hal>(&mut self, hal: &mut H, now: u64, port: u16, cq_cons: &mut Option<u32>) -> bool {
        let full = self.recv.posted_total() >= self.cfg.recv_posted_max || !self.recv_fits();
        if full && !posts_nothing(hal, &self.layout, port, self.recv.ports[port as usize].cons) {
            return false;
        }
        if !self.cqs.has_room(hal, &self.layout, &self.ports, port, cq_cons) {
            return false;
        }
        let d = self.take_desc(hal, port, false);
        self.recv.descs[1] += 1;
        if let Some((e, ld)) = self.recv_cpu().post_recv(hal, port, &d) {
            self.rdv_pull(now, port, e, &ld);
        }
        true
    }

    /// The send ring's next descriptor, which the send side stopped at
    /// (`RingStop::Program`: the caller checked CQ and table room): taken
    /// unless it must wait in the ring for a record to free; `false` then.
    fn take_send_program<H: Hal>(&mut self, hal: &mut H, now: u64, port: u16) -> bool {
        let next = self.layout.port(port).send_slot(self.send.ports[port as usize].cons);
        let opcode = Opcode::from_u8(peek_opcode(hal, next));
        let fits = |op: Opcode| self.coll_fits(op) && (!op.is_atomic() || self.atomic_fits()) && self.rma_fits(op);
        if opcode.is_some_and(|op| !fits(op)) {
            return false; // Stays in the ring until an operation or atomic record frees.
        }
        if opcode == Some(Opcode::Rbcast) {
            let wd = read_desc(hal, next);
            if !self.rbcast_admit(hal, now, port, &wd) {
                return false; // The reliable broadcast's root stalls (window or credits).
            }
        }
        let d = self.take_desc(hal, port, true);
        self.send.descs[1] += 1;
        self.take_send_desc(hal, now, port, &d);
        true
    }

    /// One descriptor from the send ring, whatever its opcode: sends,
    /// collectives and atomics start here.
    fn take_send_desc<H: Hal>(&mut self, hal: &mut H, now: u64, port: u16, d: &WorkDesc) {
        let Some((d, v)) = self.ring_desc(hal, port, true, d) else { return };
        let d = &d;
        let ld = LocalDesc::new(d);
        match v {
            Ok(Opcode::Send) => {}
            Ok(op) if op.is_collective() => return self.post_coll(hal, now, port, ld, op),
            Ok(op) if op.is_atomic() => return self.post_atomic(hal, now, port, ld, op),
            Ok(op) if op.is_rma() => return self.post_rma(hal, now, port, ld, op),
            Ok(op) if op != Opcode::Recv => return self.bad_descriptor(hal, port, &ld, op),
            // A malformed descriptor is reported under the opcode it claims.
            _ => {
                return self.bad_descriptor(
                    hal,
                    port,
                    &ld,
                    Opcode::from_u8(d.opcode).filter(|&o| o != Opcode::Recv).unwrap_or(Opcode::Send),
                )
            }
        }
        if let Some(ld) = self.send_cpu().post_send(hal, now, port, ld) {
            self.send_to_new_peer(hal, now, port, ld);
        }
    }

    /// A checked send to a peer the table holds no entry for yet: one is
    /// made (`peer_for`), or the send fails (`TableFull`).
    pub(crate) fn send_to_new_peer<H: Hal>(&mut self, hal: &mut H, now: u64, port: u16, ld: LocalDesc) {
        let Some(peer) = self.peer_for(now, port, ld.wd.node, ld.wd.port, 0) else {
            return self.complete(hal, port, Completion::of(&ld, Opcode::Send, Status::TableFull));
        };
        self.send_cpu().enqueue_tx(now, port, peer, ld);
    }

    pub(crate) fn bad_descriptor<H: Hal>(&mut self, hal: &mut H, port: u16, ld: &LocalDesc, op: Opcode) {
        self.refuse(hal, port, Completion::bad_descriptor(ld, op));
    }

    /// Reports a descriptor that runs no further; a bad one is counted.
    fn refuse<H: Hal>(&mut self, hal: &mut H, port: u16, c: Completion) {
        if c.status == Status::BadDescriptor {
            self.count(counter::BAD_DESCRIPTORS, 1);
        }
        self.complete(hal, port, c);
    }

    pub(crate) fn route_valid<H: Hal>(&self, hal: &mut H, node: u16) -> bool {
        route_valid(hal, &self.layout, node)
    }

    /// Reports a finished descriptor on this CPU ([`crate::cq::Cqs::complete`]).
    pub(crate) fn complete<H: Hal>(&mut self, hal: &mut H, port: u16, c: Completion) {
        let by = Completer {
            layout: &self.layout,
            ports: &self.ports,
            cpu: self.cpu,
            mr: &mut self.mr,
            counters: &mut self.counters,
        };
        self.cqs.complete(hal, by, port, c)
    }
}

/// The admin mailbox, when a request waits in it.
fn admin_request<H: Hal>(hal: &mut H, layout: &Layout) -> Option<AdminMailbox> {
    let mut b = [0u8; AdminMailbox::SIZE];
    hal.sram_read(layout.admin_off as usize, &mut b);
    let mb = AdminMailbox::get(&b);
    (mb.request_seq != mb.done_seq).then_some(mb)
}

/// Does an admin request wait (the whole program's)?
pub(crate) fn admin_pending<H: Hal>(hal: &mut H, layout: &Layout) -> bool {
    admin_request(hal, layout).is_some()
}

/// Does the route table name `node` (a node of this cluster)?
pub(crate) fn route_valid<H: Hal>(hal: &mut H, layout: &Layout, node: u16) -> bool {
    if node as u32 >= layout.params.route_entries {
        return false;
    }
    sram_u32(hal, layout.route_entry(node as usize) + core::mem::offset_of!(RouteEntry, valid)) == 1
}

impl SendCpu<'_> {
    /// Takes plain sends from `port`'s send ring, as CQ and table room and
    /// `budget` (descriptors this call may still take) allow, and queues
    /// each on its peer. Stops where the whole program must go on
    /// ([`RingStop`]); `None` when the ring is empty or the rest waits
    /// for room.
    pub(crate) fn take_sends<H: Hal>(
        &mut self,
        hal: &mut H,
        now: u64,
        port: u16,
        budget: &mut u32,
        cq_cons: &mut Option<u32>,
    ) -> Option<RingStop> {
        let w = self.layout.port(port);
        let prod = sram_u32(hal, w.ctl(ctl::SEND_PROD));
        while ring::has_entry(prod, self.send.ports[port as usize].cons) && *budget > 0 {
            if self.send.tx.is_full() {
                return None;
            }
            let next = w.send_slot(self.send.ports[port as usize].cons);
            match Opcode::from_u8(peek_opcode(hal, next)) {
                // A start names a stored send; an unknown opcode is refused here.
                None | Some(Opcode::Send | Opcode::Start) => {}
                Some(_) => return Some(RingStop::Program),
            }
            // The CQ's room is checked and reserved in one hold of the
            // semaphore: the receive side reserves on the same CQ.
            let g = self.shared.lock();
            if !g.cqs.has_room(hal, self.layout, self.ports, port, cq_cons) {
                return None;
            }
            *budget -= 1;
            let (cons, outstanding) =
                (&mut self.send.ports[port as usize].cons, &mut g.cqs.ports[port as usize].outstanding);
            let d = take_desc(hal, self.layout, port, true, cons, outstanding);
            drop(g);
            if let Some(ld) = self.take_send(hal, now, port, &d) {
                self.send.descs[1] += 1;
                return Some(RingStop::NewPeer(ld));
            }
            self.send.descs[0] += 1;
        }
        None
    }

    /// A send (or a start of a stored one) just taken from the ring; `Some`
    /// when its peer needs an entry first.
    fn take_send<H: Hal>(&mut self, hal: &mut H, now: u64, port: u16, d: &WorkDesc) -> Option<LocalDesc> {
        let (d, v) = match ring_desc(&mut self.send.ports[port as usize].stored, true, d) {
            Ok(run) => run,
            Err(c) => {
                self.refuse(hal, port, c);
                return None;
            }
        };
        let ld = LocalDesc::new(&d);
        if v != Ok(Opcode::Send) {
            // A malformed descriptor is reported under the opcode it claims.
            let op = Opcode::from_u8(d.opcode).filter(|&o| o != Opcode::Recv).unwrap_or(Opcode::Send);
            self.refuse(hal, port, Completion::bad_descriptor(&ld, op));
            return None;
        }
        self.post_send(hal, now, port, ld)
    }

    /// A validated send: checked, and queued on its peer; `Some` when the
    /// peer table holds no entry for it yet (`Nic::send_to_new_peer`).
    pub(crate) fn post_send<H: Hal>(&mut self, hal: &mut H, now: u64, port: u16, ld: LocalDesc) -> Option<LocalDesc> {
        let checked = self.shared.lock().mr.check_sges(hal, self.layout, port, ld.sges(), MR_LOCAL_READ);
        if let Err(st) = checked {
            self.complete(hal, port, Completion::of(&ld, Opcode::Send, st));
            return None;
        }
        if ld.len > self.cfg.msg_max {
            self.complete(hal, port, Completion::of(&ld, Opcode::Send, Status::TooLarge));
            return None;
        }
        if !route_valid(hal, self.layout, ld.wd.node) {
            self.refuse(hal, port, Completion::bad_descriptor(&ld, Opcode::Send));
            return None;
        }
        let Some(&peer) = self.peer_index.get(&(port, ld.wd.node, ld.wd.port)) else { return Some(ld) };
        self.send.peer_mut(peer).last_ns = now;
        self.enqueue_tx(now, port, peer, ld);
        None
    }

    /// Reports a descriptor that runs no further; a bad one is counted.
    fn refuse<H: Hal>(&mut self, hal: &mut H, port: u16, c: Completion) {
        if c.status == Status::BadDescriptor {
            self.counters.add(counter::BAD_DESCRIPTORS, 1);
        }
        self.complete(hal, port, c);
    }
}

impl RecvCpu<'_> {
    /// Posts receives (and runs probes and cancels) from `port`'s receive
    /// ring, as the posted table, CQ room and `budget` (descriptors this
    /// call may still take) allow; `true` when it stopped for the whole
    /// program: retained headers wait, and a receive may start a pull.
    pub(crate) fn take_recvs<H: Hal>(
        &mut self,
        hal: &mut H,
        port: u16,
        budget: &mut u32,
        cq_cons: &mut Option<u32>,
    ) -> bool {
        let w = self.layout.port(port);
        let prod = sram_u32(hal, w.ctl(ctl::RECV_PROD));
        // Receives posted on every port; posting one changes only this
        // port's list.
        let mut total = self.recv.posted_total();
        while ring::has_entry(prod, self.recv.ports[port as usize].cons) && *budget > 0 {
            debug_assert_eq!(total, self.recv.posted_total());
            if self.recv.rdv_held > 0 {
                return true;
            }
            if total >= self.cfg.recv_posted_max
                && !posts_nothing(hal, self.layout, port, self.recv.ports[port as usize].cons)
            {
                return false;
            }
            let g = self.shared.lock();
            if !g.cqs.has_room(hal, self.layout, self.ports, port, cq_cons) {
                return false;
            }
            *budget -= 1;
            let (cons, outstanding) =
                (&mut self.recv.ports[port as usize].cons, &mut g.cqs.ports[port as usize].outstanding);
            let d = take_desc(hal, self.layout, port, false, cons, outstanding);
            drop(g);
            let here = self.recv.ports[port as usize].posted.len() as u32;
            let pull = self.post_recv(hal, port, &d);
            debug_assert!(pull.is_none(), "no retained header, so no pull");
            self.recv.descs[0] += 1;
            total = total - here + self.recv.ports[port as usize].posted.len() as u32;
        }
        false
    }

    /// One descriptor from the receive ring: a receive is matched against
    /// the unexpected messages, else posted; a probe or cancel runs. `Some`
    /// when the receive takes a retained header, whose pull is the whole
    /// program's (`Nic::rdv_pull`).
    pub(crate) fn post_recv<H: Hal>(&mut self, hal: &mut H, port: u16, d: &WorkDesc) -> Option<(u32, LocalDesc)> {
        let (d, v) = match ring_desc(&mut self.recv.ports[port as usize].stored, false, d) {
            Ok(run) => run,
            Err(c) => {
                self.refuse(hal, port, c);
                return None;
            }
        };
        let ld = LocalDesc::new(&d);
        match v {
            Ok(Opcode::Recv) => {}
            Ok(Opcode::Probe) => {
                self.probe(hal, port, &ld);
                return None;
            }
            Ok(Opcode::Cancel) => {
                self.cancel_recv(hal, port, &ld);
                return None;
            }
            _ => {
                self.refuse(hal, port, Completion::bad_descriptor(&ld, Opcode::Recv));
                return None;
            }
        }
        let checked = self.shared.lock().mr.check_sges(hal, self.layout, port, ld.sges(), MR_LOCAL_WRITE);
        if let Err(st) = checked {
            self.complete(hal, port, Completion::of(&ld, Opcode::Recv, st));
            return None;
        }
        let pull = if d.flags & emp_uapi::desc::WD_CLAIM != 0 {
            self.recv_claimed(hal, port, &ld)
        } else if let Some(e) = self.find_unexpected(port, &ld) {
            self.take_unexpected(hal, port, e, &ld)
        } else {
            self.recv.ports[port as usize].posted.push_back(ld);
            // `kick_refused` scans every peer slot (1024 by default): with no
            // live peer waiting for a receive (almost always), skip it.
            let refused = |&i: &u32| self.recv.peer(i).rnr_seq.is_some();
            if self.peer_index.values().any(refused) {
                self.kick_refused(hal, port, &ld);
            }
            None
        };
        pull.map(|e| (e, ld))
    }

    /// Reports a descriptor that runs no further; a bad one is counted.
    fn refuse<H: Hal>(&mut self, hal: &mut H, port: u16, c: Completion) {
        if c.status == Status::BadDescriptor {
            self.count(counter::BAD_DESCRIPTORS, 1);
        }
        self.complete(hal, port, c);
    }
}

/// The receive ring's descriptor at consumer index `cons` posts nothing (a
/// probe or a cancel): it may pass a full posted table (a cancel may be
/// what frees it). Only then is the opcode peeked.
fn posts_nothing<H: Hal>(hal: &mut H, layout: &Layout, port: u16, cons: u32) -> bool {
    let next = layout.port(port).recv_slot(cons);
    matches!(Opcode::from_u8(peek_opcode(hal, next)), Some(Opcode::Probe | Opcode::Cancel))
}

/// The opcode byte of the descriptor at `off`, without consuming it.
fn peek_opcode<H: Hal>(hal: &mut H, off: usize) -> u8 {
    let mut b = [0u8; 1];
    hal.sram_read(off + core::mem::offset_of!(WorkDesc, opcode), &mut b);
    b[0]
}

fn read_desc<H: Hal>(hal: &mut H, off: usize) -> WorkDesc {
    let mut b = [0u8; WorkDesc::SIZE];
    hal.sram_read(off, &mut b);
    WorkDesc::get(&b)
}
