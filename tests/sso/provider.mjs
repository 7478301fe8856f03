// A real OpenID Connect provider for the single sign-on tests (node's oidc-provider, its development login
// and consent pages). Usage: node provider.mjs PORT CONFIG.json. CONFIG: {"clients": [...], "accounts":
// {"login": {claims...}}}; the file is read again at every sign-in, so a test changes a person's groups
// between two sign-ins. Prints "ready ISSUER" once it listens.
import { createHash } from "node:crypto";
import { appendFileSync, mkdirSync, readFileSync } from "node:fs";
import Provider from "oidc-provider";

const [port, configPath] = process.argv.slice(2);
const issuer = `http://127.0.0.1:${port}`;
const config = () => JSON.parse(readFileSync(configPath, "utf8"));

const provider = new Provider(issuer, {
  clients: config().clients,
  async findAccount(ctx, id) {
    const claims = config().accounts[id];
    if (!claims) return undefined;
    return { accountId: id, async claims() { return { sub: id, ...claims }; } };
  },
  claims: { openid: ["sub"], email: ["email"], profile: ["preferred_username", "name"], groups: ["groups"] },
  scopes: ["openid", "email", "profile", "groups"],
  features: { devInteractions: { enabled: true }, rpInitiatedLogout: { enabled: true } },
  pkce: { required: () => false },
  ttl: { Session: 3600, Interaction: 600, Grant: 3600, AuthorizationCode: 60, IdToken: 3600, AccessToken: 3600 },
  // The id token carries the claims too (Tether reads the userinfo endpoint as well).
  conformIdTokenClaims: false,
  cookies: { keys: ["tether-tests-only-cookie-key"] },
  // The signing key the tests made (they sign tokens of their own with it: another audience, an expired one).
  ...(config().jwks ? { jwks: config().jwks } : {}),
});
provider.proxy = false;
// What it hands out (codes, access and refresh tokens: their value is their jti) is remembered for the search of
// the run's logs (tests/run_secrets.py), as a hash, never in plain.
const secrets = process.env.TETHER_TEST_SECRETS;
for (const [event, kind] of [["authorization_code.saved", "OIDC_code"], ["access_token.saved", "OIDC_access_token"],
                             ["refresh_token.saved", "OIDC_refresh_token"]]) {
  provider.on(event, (token) => {
    if (!secrets) return;
    mkdirSync(secrets, { recursive: true });
    const digest = createHash("sha256").update(token.jti).digest("hex");
    appendFileSync(`${secrets}/oidc-provider-${process.pid}.txt`, `${kind} ${token.jti.length} ${digest}\n`);
  });
}
provider.listen(Number(port), "127.0.0.1", () => console.log(`ready ${issuer}`));
