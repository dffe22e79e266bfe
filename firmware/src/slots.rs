//! A bounded table of records addressed by slot number, sized once.

/// `max` slots; a free list hands them out.
#[derive(Debug)]
pub(crate) struct Slots<T> {
    slots: Vec<Option<T>>,
    free: Vec<u32>,
}

impl<T> Slots<T> {
    pub(crate) fn new(max: u32) -> Self {
        Slots { slots: (0..max).map(|_| None).collect(), free: (0..max).rev().collect() }
    }
    pub(crate) fn is_full(&self) -> bool {
        self.free.is_empty()
    }
    pub(crate) fn used(&self) -> u32 {
        (self.slots.len() - self.free.len()) as u32
    }
    pub(crate) fn capacity(&self) -> u32 {
        self.slots.len() as u32
    }
    pub(crate) fn get(&self, s: u32) -> Option<&T> {
        self.slots.get(s as usize)?.as_ref()
    }
    /// # Panics
    /// When `s` is free: callers only hold slots they inserted.
    pub(crate) fn get_mut(&mut self, s: u32) -> &mut T {
        self.slots[s as usize].as_mut().expect("live record")
    }
    /// Stores `v`; `None` when the table is full.
    pub(crate) fn insert(&mut self, v: T) -> Option<u32> {
        let s = self.free.pop()?;
        self.slots[s as usize] = Some(v);
        Some(s)
    }
    /// Live records with their slots.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u32, &T)> {
        self.slots.iter().enumerate().filter_map(|(i, v)| v.as_ref().map(|v| (i as u32, v)))
    }
    /// Stores `v` in a table the caller checked is not full.
    pub(crate) fn insert_checked(&mut self, v: T) -> u32 {
        self.insert(v).expect("caller checked is_full")
    }
    /// Drops record `s` where it is (no move out of the table).
    /// # Panics
    /// When `s` is free.
    pub(crate) fn free(&mut self, s: u32) {
        let v = &mut self.slots[s as usize];
        assert!(v.is_some(), "live record");
        *v = None;
        self.free.push(s);
    }
    /// # Panics
    /// When `s` is free.
    pub(crate) fn remove(&mut self, s: u32) -> T {
        let v = self.slots[s as usize].take().expect("live record");
        self.free.push(s);
        v
    }
}

/// Takes `slot` out of a queue that holds it at most once, keeping the
/// others' order: a search from the front, where the oldest entry (the
/// one that usually finishes) is, not a pass over the whole queue.
pub(crate) fn remove_once(queue: &mut std::collections::VecDeque<u32>, slot: u32) {
    if let Some(i) = queue.iter().position(|&s| s == slot) {
        queue.remove(i);
    }
    debug_assert!(!queue.contains(&slot), "a slot is queued once");
}

/// Fixed-length buffers lent to the records of one table (each record's
/// window of per-group state): one per slot, all made at boot. A record
/// takes one when it is created and gives it back when it retires, so
/// creating a record never allocates, whatever its message's length. A
/// buffer is given back with the length of the prefix its record used,
/// which is cleared then: a small message clears one entry, not a window.
#[derive(Debug)]
pub(crate) struct Rings<E> {
    free: Vec<Box<[E]>>,
    len: usize,
}

impl<E: Copy + Default + PartialEq> Rings<E> {
    /// `count` buffers of `len` elements.
    pub(crate) fn new(count: u32, len: u32) -> Self {
        Rings {
            free: (0..count).map(|_| vec![E::default(); len as usize].into_boxed_slice()).collect(),
            len: len as usize,
        }
    }
    /// A cleared buffer.
    ///
    /// # Panics
    /// When none is left: there is one per slot of the table the records
    /// live in, and callers take one only for a record the table has room for.
    pub(crate) fn take(&mut self) -> Box<[E]> {
        self.free.pop().expect("one ring per table slot")
    }
    /// Returns a buffer `take` handed out, of which its record wrote at
    /// most the first `used` entries.
    pub(crate) fn give(&mut self, mut b: Box<[E]>, used: usize) {
        assert_eq!(b.len(), self.len, "a ring of this pool");
        b[..used.min(self.len)].fill(E::default());
        debug_assert!(b.iter().all(|e| *e == E::default()), "a record wrote past the prefix it gave");
        self.free.push(b);
    }
    /// Buffers not lent out.
    pub(crate) fn available(&self) -> u32 {
        self.free.len() as u32
    }
}
