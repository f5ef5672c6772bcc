//! Random identifiers: `<prefix>_<32 hex digits>` (a v4 UUID without dashes).

/// A new random id with `prefix` (`usr`, `svc`, …).
pub fn new_id(prefix: &str) -> String {
    format!("{prefix}_{}", uuid::Uuid::new_v4().simple())
}

#[cfg(test)]
mod tests {
    #[test]
    fn ids_are_prefixed_and_distinct() {
        let (a, b) = (super::new_id("usr"), super::new_id("usr"));
        assert!(a.starts_with("usr_") && a.len() == 36, "{a}");
        assert_ne!(a, b);
    }
}
