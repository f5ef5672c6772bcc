//! Data migrations: the store's chain machinery, and the host's own chain.

pub use capstan_store::migrate::*;

/// The host's own chain. Its floor is the first data version Capstan ever wrote; steps are
/// appended here as the host's data model evolves, and deleted once every deployment has
/// passed them (raising the floor).
pub fn host_chain() -> Chain {
    Chain::new("capstan", "0.1.0", Vec::new())
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_host_chain_is_well_formed() {
        let chain = super::host_chain();
        assert!(chain.target() >= chain.oldest_supported);
    }
}
