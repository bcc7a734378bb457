//! Cross-module tests of the whole format: round trips and hostile input.

mod corrupt;
mod golden;
mod mutate;
mod roundtrip;
