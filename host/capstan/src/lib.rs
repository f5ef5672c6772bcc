//! Capstan: a self-hosted infrastructure control plane. This crate is the `capstan` binary:
//! `capstan serve` runs the host (`capstan-server`, with the pages of `capstan-dashboard`);
//! every other command is a client of its API (`cli`). See `ARCHITECTURE.md`.

pub use capstan_server::{
    api, auth, blobs, config, events, federation, fleet, inventory, keyring, migrate, plugins, refusal, scheduler, secrets, store,
};

pub mod cli;
