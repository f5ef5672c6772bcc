//! `capstan-field-rules`: the rules the inventory's fields meet, pure and apart from the store
//! so that the inventory enforces them on every write and the catalog publisher's tool
//! (`capstan-catalog sign`) checks every App Store template with the very same code before it
//! signs — a template an install would be refused is refused at signing.
//!
//! - [`validate`]: single values — names, images, environment names and values, mail
//!   addresses, domains, mount paths, URLs;
//! - [`port`]: the one way a port is written (`443:8080/http`), read and written back for the
//!   CLI and the dashboard alike;
//! - [`service`]: a service's ports, domains, environment, scale, volumes, mail addresses and
//!   template snapshot as wholes (counts, collisions, sizes).
//!
//! Every refusal names its field in `data.field` and never echoes a value that might be secret.

pub mod port;
pub mod service;
pub mod validate;
