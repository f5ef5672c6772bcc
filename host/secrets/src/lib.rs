//! Secrets: write-only material in envelopes (a DEK per version, wrapped by the keyring's KEK),
//! values that arrive generated or sealed to the ingress recipient, and answers that carry
//! metadata only.

pub mod envelope;
pub mod ingress;
pub mod managed;
pub mod manifests;
pub mod methods;
pub mod sets;
