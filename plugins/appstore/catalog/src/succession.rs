//! Succession: whether a verified candidate may replace the active catalog.
//!
//! A candidate succeeds the active catalog only when its revision is greater, and every version
//! the active catalog published is still there with the same template (compared by
//! [`Template::digest`](crate::Template::digest)), and no version the active catalog withdrew is
//! offered again. Withdrawing a version is the only change a published version admits; its
//! release notes and its app's display fields may change freely.

use crate::envelope::Verified;
use crate::error::CatalogError;

/// Check that `candidate` may replace `active` (anything may replace no catalog).
///
/// Refuses, naming the app and version: `catalog-revision-not-newer`, `catalog-version-removed`,
/// `catalog-version-rewritten`, `catalog-version-reinstated` — the first broken rule in the
/// active catalog's order. A confirmation of the active catalog (the same revision and digest,
/// [`Verified::same_as`]) is refused `catalog-revision-not-newer` like any other; ask
/// `same_as` first to tell it apart.
pub fn check_succession(active: Option<&Verified>, candidate: &Verified) -> Result<(), CatalogError> {
    let Some(active) = active else {
        return Ok(());
    };
    if candidate.revision() <= active.revision() {
        return Err(CatalogError::RevisionNotNewer { active: active.revision(), candidate: candidate.revision() });
    }
    for app in active.apps() {
        let next = candidate.app(&app.id);
        for published in &app.versions {
            let named = || (app.id.clone(), published.version.to_string());
            let Some(successor) = next.and_then(|next| next.version(&published.version)) else {
                let (app, version) = named();
                return Err(CatalogError::VersionRemoved { app, version });
            };
            let (before, after) = (published.template.digest_hex(), successor.template.digest_hex());
            if before != after {
                let (app, version) = named();
                return Err(CatalogError::VersionRewritten { app, version, active_digest: before, candidate_digest: after });
            }
            if published.is_withdrawn() && !successor.is_withdrawn() {
                let (app, version) = named();
                return Err(CatalogError::VersionReinstated { app, version });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tests::{app, catalog, version};
    use crate::model::{Catalog, Withdrawal};
    use crate::{PublisherKey, sign, verify};
    use ed25519_dalek::SigningKey;

    fn verified(catalog: &Catalog, revision: u64) -> Verified {
        let key = SigningKey::from_bytes(&[3; 32]);
        verify(sign(catalog, revision, &key).unwrap().to_json().as_bytes(), &[PublisherKey::from(&key)]).unwrap()
    }

    fn withdraw(c: &mut Catalog, app: usize, version: usize) {
        c.apps[app].versions[version].withdrawn = Some(Withdrawal { reason: "a security fix is in 1.1.0".into() });
    }

    #[test]
    fn a_first_catalog_and_a_growing_one_succeed() {
        let active = verified(&catalog(), 5);
        assert_eq!(check_succession(None, &active), Ok(()));
        let mut next = catalog();
        next.apps[0].versions.push(version("1.2.0", "registry.example.com/wiki:1.2.0"));
        next.apps.push(app("blog", &["0.1.0"]));
        next.apps.swap(0, 1);
        next.apps[1].name = "Chat, renamed".into();
        next.apps[0].versions[0].notes = "notes may be edited".into();
        assert_eq!(check_succession(Some(&active), &verified(&next, 6)), Ok(()));
        // withdrawing is allowed, and a withdrawal stays
        withdraw(&mut next, 0, 0);
        let withdrawn = verified(&next, 7);
        assert_eq!(check_succession(Some(&active), &withdrawn), Ok(()));
        assert_eq!(check_succession(Some(&withdrawn), &verified(&next, 8)), Ok(()));
    }

    #[test]
    fn an_old_or_equal_revision_is_not_newer() {
        let active = verified(&catalog(), 5);
        for revision in [1, 4, 5] {
            let err = check_succession(Some(&active), &verified(&catalog(), revision)).unwrap_err();
            assert_eq!(err, CatalogError::RevisionNotNewer { active: 5, candidate: revision });
        }
        let again = verified(&catalog(), 5);
        assert!(again.same_as(&active), "a confirmation is told apart with same_as");
    }

    #[test]
    fn a_removed_version_or_app_is_named() {
        let active = verified(&catalog(), 5);
        let mut next = catalog();
        next.apps[0].versions.remove(1);
        let err = check_succession(Some(&active), &verified(&next, 6)).unwrap_err();
        assert_eq!(err, CatalogError::VersionRemoved { app: "wiki".into(), version: "1.1.0".into() });
        let mut next = catalog();
        next.apps.remove(1);
        let err = check_succession(Some(&active), &verified(&next, 6)).unwrap_err();
        assert_eq!((err.code(), err.app(), err.version()), ("catalog-version-removed", Some("chat"), Some("2.0.0")));
        // a withdrawn version is published too: it may not go either
        let mut withdrawn = catalog();
        withdraw(&mut withdrawn, 0, 0);
        let active = verified(&withdrawn, 6);
        withdrawn.apps[0].versions.remove(0);
        let err = check_succession(Some(&active), &verified(&withdrawn, 7)).unwrap_err();
        assert_eq!((err.code(), err.version()), ("catalog-version-removed", Some("1.0.0")));
    }

    #[test]
    fn a_rewritten_template_is_named_with_both_digests() {
        let active = verified(&catalog(), 5);
        for edit in [
            (|c: &mut Catalog| c.apps[1].versions[0].template.image = "registry.example.com/chat:2.0.1".into()) as fn(&mut Catalog),
            |c| c.apps[1].versions[0].template.capabilities.push("mail".into()),
            |c| {
                c.apps[1].versions[0].template.environment.insert("LOG_LEVEL".into(), "debug".into());
            },
            |c| c.apps[1].versions[0].template.ports[0].public_port = Some(80),
            |c| c.apps[1].versions[0].template.volumes.clear(),
        ] {
            let mut next = catalog();
            edit(&mut next);
            let err = check_succession(Some(&active), &verified(&next, 6)).unwrap_err();
            let CatalogError::VersionRewritten { app, version, active_digest, candidate_digest } = &err else {
                panic!("{err:?}");
            };
            assert_eq!((app.as_str(), version.as_str()), ("chat", "2.0.0"));
            assert_eq!(active_digest, &catalog().apps[1].versions[0].template.digest_hex());
            assert_eq!(candidate_digest, &next.apps[1].versions[0].template.digest_hex());
            assert!(err.to_string().contains("chat 2.0.0"), "{err}");
        }
    }

    #[test]
    fn a_withdrawal_is_never_undone() {
        let mut withdrawn = catalog();
        withdraw(&mut withdrawn, 0, 1);
        let active = verified(&withdrawn, 5);
        let err = check_succession(Some(&active), &verified(&catalog(), 6)).unwrap_err();
        assert_eq!(err, CatalogError::VersionReinstated { app: "wiki".into(), version: "1.1.0".into() });
        assert_eq!(err.data()["appId"], "wiki");
    }
}
