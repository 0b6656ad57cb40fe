"""An OAuth 2.1 authorization server for Airlock's tests, built on authlib.

It serves, on 127.0.0.1 at a free port (printed on stdout as
``listening http://127.0.0.1:PORT``, the issuer):

- ``/token``: the client credentials grant (client_secret_basic), with RFC
  8707's ``resource`` as the token's audience. A client's tokens are JWT
  access tokens (RFC 9068, RS256, signed with the current key) or opaque.
- ``/jwks``: the public half of the current signing key.
- ``/introspect`` (RFC 7662) and ``/revoke`` (RFC 7009), for opaque tokens.
- ``/.well-known/oauth-authorization-server`` (RFC 8414).

And, for the tests only:

- ``POST /test/rotate``: a new signing key; the JWKS publishes only it.
- ``POST /test/sign``: a JSON object of claims, signed with the current
  key (an expired token, one for another audience or issuer).
- ``GET /test/public.pem``: the current public key as PEM (the HMAC
  key-confusion attack signs with it).

Usage: ``server.py CLIENTS.json``, where the file lists clients:
``[{"id": "ann-laptop", "secret": "s", "sub": "ann", "scope": "tools",
"format": "jwt"}]`` (``sub`` defaults to the id, ``format`` to ``jwt``).
"""

import json
import secrets
import sys
import time

from authlib.integrations.flask_oauth2 import AuthorizationServer
from authlib.oauth2.rfc6749 import ClientMixin, TokenMixin, grants
from authlib.oauth2.rfc6750 import BearerTokenGenerator
from authlib.oauth2.rfc7009 import RevocationEndpoint
from authlib.oauth2.rfc7662 import IntrospectionEndpoint
from authlib.oauth2.rfc9068 import JWTBearerTokenGenerator
from flask import Flask, jsonify, request
from joserfc import jwt
from joserfc.jwk import RSAKey
from werkzeug.serving import make_server

LIFETIME = 3600


class Client(ClientMixin):
    def __init__(self, entry):
        self.client_id = entry["id"]
        self.secret = entry["secret"]
        self.sub = entry.get("sub", entry["id"])
        self.scope = entry.get("scope", "")
        self.format = entry.get("format", "jwt")

    def get_client_id(self):
        return self.client_id

    def get_default_redirect_uri(self):
        return None

    def get_allowed_scope(self, scope):
        allowed = set(self.scope.split())
        if not scope:
            return self.scope
        return " ".join(s for s in scope.split() if s in allowed)

    def check_redirect_uri(self, redirect_uri):
        return False

    def check_client_secret(self, client_secret):
        return secrets.compare_digest(self.secret, client_secret)

    def check_endpoint_auth_method(self, method, endpoint):
        return method in ("client_secret_basic", "client_secret_post")

    def check_response_type(self, response_type):
        return False

    def check_grant_type(self, grant_type):
        return grant_type == "client_credentials"


class Token(TokenMixin):
    def __init__(self, client, body, audience):
        self.client = client
        self.access_token = body["access_token"]
        self.scope = body.get("scope", "")
        self.issued = int(time.time())
        self.lifetime = body.get("expires_in", LIFETIME)
        self.audience = audience
        self.revoked = False

    def check_client(self, client):
        return client.get_client_id() == self.client.get_client_id()

    def get_scope(self):
        return self.scope

    def get_expires_in(self):
        return self.lifetime

    def is_expired(self):
        return time.time() >= self.issued + self.lifetime

    def is_revoked(self):
        return self.revoked


class Keys:
    """The current signing key."""

    def __init__(self):
        self.rotate()

    def rotate(self):
        kid = "key-" + secrets.token_hex(4)
        self.key = RSAKey.generate_key(
            2048, parameters={"kid": kid, "alg": "RS256", "use": "sig"}
        )

    def private_set(self):
        return {"keys": [self.key.as_dict(private=True)]}

    def public_set(self):
        return {"keys": [self.key.as_dict(private=False)]}


def main():
    with open(sys.argv[1]) as f:
        clients = {entry["id"]: Client(entry) for entry in json.load(f)}
    keys = Keys()
    tokens = {}
    app = Flask(__name__)
    server = make_server("127.0.0.1", 0, app, threaded=True)
    issuer = f"http://127.0.0.1:{server.server_port}"

    class Signed(JWTBearerTokenGenerator):
        def get_jwks(self):
            return keys.private_set()

        def get_audiences(self, client, user, scope):
            # RFC 8707: the resource the client asked for is the audience.
            return request.form.get("resource") or client.get_client_id()

        def get_extra_claims(self, client, grant_type, user, scope):
            return {"sub": client.sub}

    signed = Signed(issuer=issuer)
    opaque = BearerTokenGenerator(lambda **_: secrets.token_urlsafe(32))

    def generate(grant_type, client, user=None, scope=None, expires_in=None,
                 include_refresh_token=False):
        which = signed if client.format == "jwt" else opaque
        return which(grant_type=grant_type, client=client, user=user, scope=scope,
                     expires_in=LIFETIME, include_refresh_token=False)

    def save_token(body, req):
        tokens[body["access_token"]] = Token(
            req.client, body, request.form.get("resource"))

    authorization = AuthorizationServer(
        app, query_client=clients.get, save_token=save_token)
    authorization.register_grant(grants.ClientCredentialsGrant)
    authorization.register_token_generator("client_credentials", generate)

    class Introspect(IntrospectionEndpoint):
        CLIENT_AUTH_METHODS = ["client_secret_basic"]

        def query_token(self, token_string, token_type_hint):
            return tokens.get(token_string)

        def check_permission(self, token, client, req):
            return True

        def introspect_token(self, token):
            answer = {
                "active": True,
                "client_id": token.client.get_client_id(),
                "sub": token.client.sub,
                "scope": token.scope,
                "iss": issuer,
                "exp": token.issued + token.lifetime,
                "iat": token.issued,
                "token_type": "Bearer",
            }
            if token.audience:
                answer["aud"] = token.audience
            return answer

    class Revoke(RevocationEndpoint):
        CLIENT_AUTH_METHODS = ["client_secret_basic"]

        def query_token(self, token_string, token_type_hint):
            return tokens.get(token_string)

        def revoke_token(self, token, req):
            token.revoked = True

    authorization.register_endpoint(Introspect)
    authorization.register_endpoint(Revoke)

    @app.post("/token")
    def token():
        return authorization.create_token_response()

    @app.post("/introspect")
    def introspect():
        return authorization.create_endpoint_response("introspection")

    @app.post("/revoke")
    def revoke():
        return authorization.create_endpoint_response("revocation")

    @app.get("/authorize")
    def authorize():
        return jsonify({"error": "unsupported_response_type"}), 400

    @app.get("/jwks")
    def jwks():
        return jsonify(keys.public_set())

    @app.get("/.well-known/oauth-authorization-server")
    def metadata():
        return jsonify({
            "issuer": issuer,
            # Required by RFC 8414 (and the MCP SDKs) although no grant
            # served here uses it: it refuses every request.
            "authorization_endpoint": f"{issuer}/authorize",
            "token_endpoint": f"{issuer}/token",
            "jwks_uri": f"{issuer}/jwks",
            "introspection_endpoint": f"{issuer}/introspect",
            "revocation_endpoint": f"{issuer}/revoke",
            "grant_types_supported": ["client_credentials"],
            "token_endpoint_auth_methods_supported": [
                "client_secret_basic", "client_secret_post"],
            "response_types_supported": ["token"],
        })

    @app.post("/test/rotate")
    def rotate():
        keys.rotate()
        return jsonify(keys.public_set())

    @app.post("/test/sign")
    def sign():
        header = {"alg": "RS256", "kid": keys.key.kid, "typ": "at+jwt"}
        return jwt.encode(header, request.get_json(), keys.key)

    @app.get("/test/public.pem")
    def public_pem():
        return keys.key.as_pem(private=False)

    print(f"listening {issuer}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
