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
    /// # Panics
    /// When `s` is free.
    pub(crate) fn remove(&mut self, s: u32) -> T {
        let v = self.slots[s as usize].take().expect("live record");
        self.free.push(s);
        v
    }
}
