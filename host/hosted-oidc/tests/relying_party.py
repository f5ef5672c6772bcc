#!/usr/bin/env python3
"""A hosted app's side of signing in through Capstan, played by authlib (a real relying party).

Driven by host/hosted-oidc/tests/relying_party.rs, which serves the provider. Configuration comes
from the environment: RP_ISSUER, RP_CLIENT_ID, RP_CLIENT_SECRET, RP_REDIRECT_URI, and optionally
RP_OLD_ID_TOKEN with RP_OLD_NONCE (an ID token from an earlier flow that must still verify with
the JWKS as it is now). AUTHLIB_INSECURE_TRANSPORT=1 lets authlib speak http to 127.0.0.1.

The exchange, one JSON object per line:
  1. discovery is fetched; the authorization URL (PKCE S256, state, nonce) is printed:
     {"authorize": "<url>"}
  2. the redirect the browser would come back with is read from stdin (one line);
  3. the code is exchanged with client_secret_basic, the ID token is validated with the keys of
     jwks_uri (signature, iss, aud, exp, iat, nonce, at_hash), userinfo is read, and printed:
     {"kid": …, "claims": {…}, "userinfo": {…}, "id_token": …, "nonce": …, "code": …,
      "code_verifier": …, "jwks_kids": [...], "old_token_verified": true|null}
Any failure is printed on stderr and the exit status is 1.
"""

import json
import os
import sys
import warnings
from urllib.parse import parse_qs, urlparse

# authlib.jose's deprecation notice (its successor is joserfc) is not this test's business
warnings.filterwarnings("ignore", message=".*deprecated.*")

from authlib.common.security import generate_token  # noqa: E402
from authlib.integrations.requests_client import OAuth2Session  # noqa: E402
from authlib.jose import JsonWebKey, jwt  # noqa: E402
from authlib.oidc.core import CodeIDToken  # noqa: E402


def say(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def validate(id_token, jwks, issuer, client_id, nonce, access_token=None):
    """The ID token's claims, verified as an app does: the signature with the published keys
    (picked by kid), then iss, aud, exp, iat, nonce (and at_hash with the access token)."""
    keys = JsonWebKey.import_key_set(jwks)
    claims = jwt.decode(
        id_token,
        keys,
        claims_cls=CodeIDToken,
        claims_options={"iss": {"essential": True, "value": issuer}, "aud": {"essential": True, "value": client_id}},
        claims_params={"nonce": nonce, "client_id": client_id, "access_token": access_token},
    )
    claims.validate(leeway=5)
    return claims


def main():
    issuer = os.environ["RP_ISSUER"]
    client_id = os.environ["RP_CLIENT_ID"]
    redirect_uri = os.environ["RP_REDIRECT_URI"]
    session = OAuth2Session(
        client_id,
        os.environ["RP_CLIENT_SECRET"],
        scope="openid profile roles",
        redirect_uri=redirect_uri,
        code_challenge_method="S256",
        token_endpoint_auth_method="client_secret_basic",
    )
    discovery = session.get(issuer + "/.well-known/openid-configuration", timeout=10, withhold_token=True)
    discovery.raise_for_status()
    meta = discovery.json()
    assert meta["issuer"] == issuer, meta["issuer"]
    assert "S256" in meta["code_challenge_methods_supported"], meta
    assert "client_secret_basic" in meta["token_endpoint_auth_methods_supported"], meta

    code_verifier = generate_token(64)
    nonce = generate_token(24)
    url, state = session.create_authorization_url(meta["authorization_endpoint"], code_verifier=code_verifier, nonce=nonce)
    say({"authorize": url})

    redirect = sys.stdin.readline().strip()
    if not redirect:
        raise SystemExit("no redirect came back on stdin")
    back = parse_qs(urlparse(redirect).query)
    assert back.get("iss") == [issuer], back.get("iss")
    # authlib checks the state it sent before it asks for the token
    token = session.fetch_token(meta["token_endpoint"], authorization_response=redirect, code_verifier=code_verifier)
    assert token["token_type"].lower() == "bearer", token["token_type"]
    assert "refresh_token" not in token, "no refresh tokens"

    jwks_answer = session.get(meta["jwks_uri"], timeout=10, withhold_token=True)
    jwks_answer.raise_for_status()
    jwks = jwks_answer.json()
    claims = validate(token["id_token"], jwks, issuer, client_id, nonce, token["access_token"])
    header = json.loads(__import__("base64").urlsafe_b64decode(token["id_token"].split(".")[0] + "=="))

    userinfo = session.get(meta["userinfo_endpoint"], timeout=10)
    userinfo.raise_for_status()

    old_verified = None
    if os.environ.get("RP_OLD_ID_TOKEN"):
        # an ID token issued before the key rotation: its key is still published, so it verifies
        # (iat/exp are still good: it is minutes old)
        validate(os.environ["RP_OLD_ID_TOKEN"], jwks, issuer, client_id, os.environ["RP_OLD_NONCE"])
        old_verified = True

    say(
        {
            "kid": header.get("kid"),
            "alg": header.get("alg"),
            "claims": dict(claims),
            "userinfo": userinfo.json(),
            "id_token": token["id_token"],
            "expires_in": token.get("expires_in"),
            "nonce": nonce,
            "state": state,
            "code": back["code"][0],
            "code_verifier": code_verifier,
            "access_token": token["access_token"],
            "jwks_kids": [key.get("kid") for key in jwks["keys"]],
            "old_token_verified": old_verified,
        }
    )


if __name__ == "__main__":
    try:
        main()
    except SystemExit:
        raise
    except Exception as error:  # the Rust test shows this
        sys.stderr.write(f"relying party failed: {type(error).__name__}: {error}\n")
        sys.exit(1)
