//! The integration tests of memra-server, one module per area, linked into one test binary.

mod api;
mod auth;
mod common;
mod flags;
mod lifecycle;
mod real_model;
mod security;
mod served;
mod tiny_engine;
