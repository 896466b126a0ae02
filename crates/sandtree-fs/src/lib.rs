#![forbid(unsafe_code)]
//! (being written)
