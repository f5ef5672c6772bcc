//! End-to-end tests: each starts the real `capstan` binary (`CARGO_BIN_EXE_capstan`) in its own
//! temporary directory on port 0 and talks to it as a client would (HTTP, exit status, output),
//! preparing or inspecting its SQLite store through the library where no API exists yet.

mod api;
mod appstore;
mod appstore_catalog;
mod appstore_cli;
mod appstore_demo;
mod appstore_npm;
mod audit;
mod authorization;
mod backups;
mod browser;
mod call;
mod config;
mod coremail;
mod crash;
mod docs_plugins;
mod events;
mod fleet;
mod gateway;
mod hostile;
mod identity;
mod ingress;
mod inventory;
mod logging;
mod mail;
mod mcp;
mod migrations;
mod mongo;
mod nodes;
mod nodes_cli;
mod operating;
mod plugin_dev;
mod plugins;
mod registry;
mod relays;
mod relays_cli;
mod runtime_cli;
mod s3;
mod secrets;
mod serve;
mod snapshot;
mod socket;
mod support;
mod tasks;
mod users_cli;
