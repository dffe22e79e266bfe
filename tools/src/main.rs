//! The `emp` command.
mod fw;
fn main() {}
