//! The identity provider asked again: before every owner write of a person who signed in
//! through it, Capstan introspects the session's access token (RFC 7662) and brings the
//! person's provider-granted memberships in step with the organizations the provider names now.
//! A token the provider no longer calls active ends the session (`federated-session-ended`); a
//! provider that does not answer refuses the write (`identity-provider-unavailable`): fail closed.

use crate::login::{FederatedSession, Tokens, organizations};
use crate::{Federation, SESSION_PREFIX, SESSIONS, http, refusal_internal};
use capstan_core::refusal::{Refusal, Result};
use capstan_keyring::seal::Context;
use capstan_rpc::Identity;
use serde_json::Value;

fn ended() -> Refusal {
    Refusal::new("federated-session-ended", "the identity provider ended this sign-in: sign in again")
}

fn unavailable(what: String) -> Refusal {
    Refusal::new("identity-provider-unavailable", format!("the identity provider could not confirm this write: {what}")).retryable()
}

/// Whether `session` is a federated session's id.
pub fn is_federated(session: &str) -> bool {
    session.strip_prefix(SESSION_PREFIX).is_some_and(|rest| rest.starts_with('_'))
}

impl Federation {
    /// Ask the provider about the session behind `identity` (see the module); nothing to ask
    /// for a session that did not come through it.
    pub async fn confirm(&self, identity: &Identity) -> Result<()> {
        if !is_federated(&identity.session_id) {
            return Ok(());
        }
        let sid = identity.session_id.as_str();
        let doc = self.store.transact(|tx| async move { tx.get(SESSIONS, sid).await }).await?.ok_or_else(ended)?;
        let session: FederatedSession = serde_json::from_value(doc.data).map_err(|e| refusal_internal("a federated session", e))?;
        let opened = self.keyring.open(&Context::new("federated-session").with("id", sid), &session.tokens)?;
        let tokens: Tokens = serde_json::from_slice(&opened).map_err(|e| refusal_internal("a federated session's tokens", e))?;
        let answer = self.introspect(&tokens.access_token).await?;
        if answer["active"] != Value::Bool(true) || answer.get("sub").and_then(Value::as_str).is_some_and(|s| s != session.subject) {
            self.end(sid).await?;
            tracing::info!(user = %session.user_id, session = %sid, "the identity provider ended a federated session");
            return Err(ended());
        }
        let claim = &self.settings.organization_claim;
        let named = match answer.get(claim) {
            Some(value) => value.clone(),
            None => self.userinfo(&tokens.access_token).await?.get(claim).cloned().unwrap_or(Value::Null),
        };
        let granted = organizations(claim, Some(&named))?;
        let (user, granted) = (session.user_id.as_str(), &granted);
        self.store
            .transact(|tx| async move { capstan_inventory::organizations::sync_provider_memberships(&tx, user, granted).await })
            .await?;
        Ok(())
    }

    /// End a federated session and the Capstan session it carries.
    async fn end(&self, sid: &str) -> Result<()> {
        self.store
            .transact(|tx| async move {
                for collection in [SESSIONS, capstan_auth::SESSIONS] {
                    if let Some(doc) = tx.get(collection, sid).await? {
                        tx.delete(collection, sid, doc.revision).await?;
                    }
                }
                Ok(())
            })
            .await
    }

    /// RFC 7662 introspection of `token`, with Capstan's client credentials.
    async fn introspect(&self, token: &str) -> Result<Value> {
        let form = [("token", token), ("token_type_hint", "access_token")];
        let request = self.provider.http().post(&self.provider.introspection_endpoint).header("accept", "application/json");
        let request = if self.provider.basic_auth() {
            // RFC 6749 §2.3.1: each part form-encoded before Basic
            let encode = |s: &str| url::form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
            request.basic_auth(encode(&self.settings.client_id), Some(encode(self.settings.client_secret.expose()))).form(&form)
        } else {
            let mut with_client = form.to_vec();
            with_client.push(("client_id", &self.settings.client_id));
            with_client.push(("client_secret", self.settings.client_secret.expose()));
            request.form(&with_client)
        };
        self.json(request, "introspection").await
    }

    /// The live userinfo for `token`.
    async fn userinfo(&self, token: &str) -> Result<Value> {
        let client = self.provider.client(&self.settings)?;
        let url =
            client.user_info_url().map(|u| u.url().to_string()).ok_or_else(|| unavailable("it advertises no userinfo endpoint".into()))?;
        self.json(self.provider.http().get(url).bearer_auth(token).header("accept", "application/json"), "userinfo").await
    }

    async fn json(&self, request: reqwest::RequestBuilder, what: &str) -> Result<Value> {
        let response = request.send().await.map_err(|e| unavailable(http::describe(&e)))?;
        let status = response.status();
        if status == reqwest::StatusCode::UNAUTHORIZED && what == "userinfo" {
            return Err(ended());
        }
        if !status.is_success() {
            return Err(unavailable(format!("its {what} endpoint answered {status}")));
        }
        let bytes = response.bytes().await.map_err(|e| unavailable(http::describe(&e)))?;
        serde_json::from_slice(&bytes).map_err(|_| unavailable(format!("its {what} answer is not JSON")))
    }
}

/// The door asks here before every owner method (see [`capstan_rpc::door::LiveAuthority`]).
#[async_trait::async_trait]
impl capstan_rpc::door::LiveAuthority for Federation {
    async fn confirm(&self, identity: &Identity) -> Result<()> {
        Federation::confirm(self, identity).await
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn federated_sessions_are_known_by_their_prefix() {
        assert!(super::is_federated(&capstan_core::ids::new_id(crate::SESSION_PREFIX)));
        assert!(!super::is_federated(&capstan_core::ids::new_id("session")));
        assert!(!super::is_federated("fsessionx_1"));
    }
}
