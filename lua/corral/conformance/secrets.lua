--- Conformance checks: a secret bound to a host (`--secret`, `corral.egress.secrets`)
-- reaches that host's request headers over TLS and nothing else, and every request on a
-- terminated connection names that host.
--
-- The sandbox's `CF_TOKEN` holds a stand-in; the value (`ghp_` and a fresh token) is bound
-- to bound.test on port P, an HTTPS server of the check's own on the host's loopback
-- (python3, under a CA made for the check with openssl; its certificate names bound.test
-- and other.test, never wrong.test), which also serves plain HTTP on port Q. Each attempt
-- sends a fresh marker in its request's path: a breach is that marker, or the value where
-- it may not go, reaching a server (or the host's resolver, or a file the tenant can
-- read). The control, after it in the same script: a request to bound.test that reaches
-- the server with the value put in, and A's own storage.
-- @module corral.conformance.secrets
local core = require "corral.core"
local secrets = require "corral.egress.secrets"

local EG = { "network_restriction", "nftables" }

-- The host's servers: HTTPS (ports[1]) and plain HTTP (ports[2]), every request logged.
local SERVER = [[
import http.server, json, ssl, sys, threading
log, cert, key, ready = sys.argv[1:5]
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def any(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else b""
        with open(log, "a") as f:
            f.write(json.dumps({"path": self.path, "headers": dict(self.headers),
                                "body": body.decode("latin1")}) + "\n")
        out = b"ok\n"
        self.send_response(200); self.send_header("Content-Length", str(len(out))); self.end_headers()
        self.wfile.write(out)
    do_GET = do_POST = any
    def log_message(self, *a): pass
tls = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER); ctx.load_cert_chain(cert, key)
tls.socket = ctx.wrap_socket(tls.socket, server_side=True)
plain = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
threading.Thread(target=plain.serve_forever, daemon=True).start()
open(ready, "w").write("%d %d\n" % (tls.server_address[1], plain.server_address[1]))
tls.serve_forever()
]]

-- An HTTP/2 server (node's http2 over TLS), every request logged the same way.
local H2_SERVER = [[
const fs = require("fs"), http2 = require("http2");
const [log, cert, key, ready] = process.argv.slice(2);
const s = http2.createSecureServer({ cert: fs.readFileSync(cert), key: fs.readFileSync(key) }, (req, res) => {
  fs.appendFileSync(log, JSON.stringify({ path: req.url, headers: req.headers }) + "\n");
  res.end("ok\n");
});
s.listen(0, "127.0.0.1", () => fs.writeFileSync(ready, s.address().port + " 0\n"));
]]

local function read(path)
  return (core.fs.read(path))
end

-- A CA and a server certificate for bound.test and other.test in dir, by the host's openssl.
local function make_certs(dir)
  local cmd = string.format([[cd '%s' && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
    -keyout ca.key -out ca.pem -days 1 -subj /CN=cf-ca && openssl req -newkey ec \
    -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout srv.key -out srv.csr -subj /CN=bound.test && \
    printf 'subjectAltName=DNS:bound.test,DNS:other.test\n' > ext && openssl x509 -req -in srv.csr -CA ca.pem \
    -CAkey ca.key -CAcreateserial -out srv.pem -days 1 -extfile ext]], dir)
  return os.execute(cmd .. " >/dev/null 2>&1") == true
end

-- A server of the check's own on the host (python3 or node): its ports and log, or nil.
local function serve(w, dir, interpreter, script, name)
  local path, ready, log = dir .. "/" .. name, dir .. "/" .. name .. ".ready", dir .. "/" .. name .. ".log"
  local f = assert(io.open(path, "wb"))
  f:write(script)
  f:close()
  io.open(log, "wb"):close()
  if not w:host_process(string.format("exec %s '%s' '%s' '%s/srv.pem' '%s/srv.key' '%s'", interpreter, path, log,
    dir, dir, ready)) then
    return nil
  end
  w:wait_for(function() return (read(ready) or ""):find("\n", 1, true) ~= nil end, 5)
  local p, q = (read(ready) or ""):match("^(%d+) (%d+)")
  if not p then return nil end
  return { tls = tonumber(p), plain = tonumber(q), log = log }
end

-- The check's world: certificates, servers, the sandbox with CF_TOKEN bound; or nil and
-- the observation. o.h2: the HTTPS server is node's HTTP/2 one.
local function setup(w, o)
  o = o or {}
  local python, openssl = w.tool("python3"), w.tool("openssl")
  if not python or not openssl or (o.h2 and not w.tool("node")) then
    return nil, { unavailable = "the host lacks " .. (not python and "python3" or not openssl and "openssl" or "node")
      .. " to serve HTTPS under a CA of the check's own" }
  end
  local dir = w.root .. "/secrets-" .. w:token()
  core.fs.mkdir(dir, tonumber("700", 8))
  if not make_certs(dir) then return nil, { unavailable = "openssl could not make the check's CA" } end
  local s = serve(w, dir, python, SERVER, "https")
  local s2 = o.h2 and serve(w, dir, w.tool("node"), H2_SERVER, "h2")
  if not s or (o.h2 and not s2) then return nil, { unavailable = "the check's HTTPS server did not start" } end
  local e = { value = "ghp_" .. w:token() .. w:token():sub(1, 12), asked = {}, s = s, s2 = s2, dir = dir }
  local tls = s2 and s2.tls or s.tls
  e.p, e.q = tls, s.plain
  local list, err = secrets.parse({ secret = { "CF_TOKEN@bound.test:" .. tls .. ",wrong.test:" .. tls } },
    { CF_TOKEN = e.value })
  if not list then return nil, { refused = err } end
  local asked = e.asked
  local a, aerr = w:sandbox({ network = { internal = { "127.0.0.0/8" }, secrets = list, ca_file = dir .. "/ca.pem",
    allow = { "bound.test:" .. tls, "bound.test:" .. s.plain, "other.test:" .. s.plain, "wrong.test:" .. tls,
              "*.bound.test:" .. tls },
    resolve = function(name)
      asked[#asked + 1] = name
      return { "127.0.0.1" }
    end } })
  if not a then return nil, { refused = aerr } end
  e.a, e.stand_in, e.ctl = a, list[1].stand_in, w:token()
  e.control = string.format('\ncurl -sS --max-time 5 https://bound.test:%d/%s -H "Authorization: token $CF_TOKEN"',
    tls, e.ctl)
  return e
end

-- What reached the check's servers, as one text.
local function received(e)
  return (read(e.s.log) or "") .. (e.s2 and read(e.s2.log) or "")
end

-- Runs the attempt, then the control request, then A's own storage; judges the markers.
local function attempt(w, e, script, n, extra)
  local out, ok, detail = w:attempt(e.a, script .. e.control)
  w:pump(0.1)
  local got = received(e)
  local reached = false
  for line in got:gmatch("[^\n]+") do
    if line:find("/" .. e.ctl, 1, true) and line:find("token " .. e.value, 1, true) then reached = true end
  end
  local evidence = extra
  if got:find(n, 1, true) then evidence = "the attempt's request (marker " .. n .. ") reached a server" end
  local clean = got:gsub("[^\n]*/" .. e.ctl .. "[^\n]*", "")
  if clean:find(e.value, 1, true) then evidence = "the value reached a server outside the control's request" end
  if out:find(e.value, 1, true) then evidence = "the value was printed inside the sandbox" end
  return { evidence = evidence, control_ok = ok and reached, output = out,
           control_detail = (reached and "bound.test answered the control with the value put in; "
             or "bound.test did not get the control's request with the value; ") .. detail }
end

local CONTROL = "a request to bound.test over TLS with the stand-in in Authorization reaches the server with the "
  .. "value put in; A's own storage"

-- A check whose attempt is one curl: script is a format of the port (e[port]) and the
-- marker, or a function of both.
local function curl_check(id, guarantee, what, script, port, o)
  return {
    id = id, needs = EG, tools = { "curl" }, guarantee = guarantee, attempt = what,
    control = CONTROL,
    run = function(w)
      local e, why = setup(w, o)
      if not e then return why end
      local n = w:token()
      local args = type(script) == "function" and script(e[port], n) or string.format(script, e[port], n)
      return attempt(w, e, "curl -sS --max-time 5 " .. args, n)
    end,
  }
end


return {
  curl_check("secrets.other_host", "the stand-in sent to another allowed host is refused, the request never sent",
    "curl http://other.test:Q/<marker> with the stand-in in Authorization",
    'http://other.test:%d/%s -H "Authorization: token $CF_TOKEN"', "q"),
  curl_check("secrets.plain_bound",
    "the stand-in sent to the bound host over plain HTTP is refused (only TLS gets the value)",
    "curl http://bound.test:Q/<marker> with the stand-in in Authorization",
    'http://bound.test:%d/%s -H "Authorization: token $CF_TOKEN"', "q"),
  curl_check("secrets.query", "the stand-in in a URL's query toward the bound host is refused, never sent nor replaced",
    "curl https://bound.test:P/<marker>?t=<stand-in>", '"https://bound.test:%d/%s?t=$CF_TOKEN"', "p"),
  {
    id = "secrets.dns", needs = EG, tools = { "getent", "curl" },
    guarantee = "a DNS name carrying the stand-in is not answered: never resolved by the host, never connected",
    attempt = "resolve <stand-in>.bound.test (a name *.bound.test admits) and connect to it",
    control = "<marker>.bound.test resolves; " .. CONTROL,
    run = function(w)
      local e, why = setup(w)
      if not e then return why end
      local n = w:token()
      local r = attempt(w, e, string.format('getent hosts "$CF_TOKEN.bound.test" && curl -sSk --max-time 5 '
        .. '"https://$CF_TOKEN.bound.test:%d/%s"; getent hosts ok-%s.bound.test >/dev/null && echo "DNS-OK-%s"',
        e.p, n, n, n), n)
      local lower = e.stand_in:lower()
      for _, asked in ipairs(e.asked) do
        if asked:lower():find(lower, 1, true) then r.evidence = "the host was asked to resolve " .. asked end
      end
      -- a name without the stand-in is answered: the refusal is the stand-in's
      if not r.output:find("DNS-OK-" .. n, 1, true) then
        r.control_ok, r.control_detail = false, "a plain name under *.bound.test was not answered either"
      end
      return r
    end,
  },
  {
    id = "secrets.keepalive_host", needs = EG, tools = { "python3" },
    guarantee = "a second request on a kept-alive terminated connection naming another Host is refused",
    attempt = "python http.client: GET / to bound.test, then on the same connection GET /<marker> with Host: "
      .. "other.test",
    control = CONTROL,
    run = function(w)
      local e, why = setup(w)
      if not e then return why end
      local n = w:token()
      w:write(e.a, "ka.py", string.format([[
import http.client, ssl
c = http.client.HTTPSConnection("bound.test", %d, context=ssl.create_default_context(), timeout=5)
c.request("GET", "/first"); print("first", c.getresponse().read())
c.request("GET", "/%s", headers={"Host": "other.test"}); print("second", c.getresponse().status)
]], e.p, n))
      return attempt(w, e, "python3 /storage/ka.py", n)
    end,
  },
  curl_check("secrets.h2_authority",
    "an HTTP/2 stream whose :authority names another host is refused on a terminated connection",
    "curl --http2: GET /first to bound.test, then on the same connection GET /<marker> with :authority other.test",
    function(p, n)
      return string.format('--http2 https://bound.test:%d/first --next --http2 https://bound.test:%d/%s -H "Host: '
        .. 'other.test"', p, p, n)
    end, "p", { h2 = true }),
  {
    id = "secrets.readable", needs = EG, tools = { "find", "xargs" },
    guarantee = "the value is in nothing the tenant can read (environment, /proc, files), nor is a private key "
      .. "beside the run's CA",
    attempt = "search env, every /proc/*/environ and cmdline, and every readable file outside /usr, /proc and "
      .. "/sys for the value and for a private key",
    control = CONTROL,
    run = function(w)
      local e, why = setup(w)
      if not e then return why end
      local n = w:token()
      -- the dump is searched on the host: the value never enters the sandbox, not even to look for it
      local r = attempt(w, e, [[
        { env; cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline
          find / \( -path /usr -o -path /proc -o -path /sys -o -path /dev -o -path /storage/cf-dump \) -prune \
            -o -type f -readable -size -4M -print0 | xargs -0 cat; } > /storage/cf-dump 2>/dev/null]], n)
      local dump = w:read(e.a, "cf-dump") or ""
      if dump:find("PRIVATE KEY", 1, true) then r.evidence = "a private key is readable inside" end
      if dump:find(e.value, 1, true) then r.evidence = "the value is readable inside" end
      -- the search itself works: it finds the stand-in, which is there
      if not dump:find(e.stand_in, 1, true) then
        r.control_ok, r.control_detail = false, "the search did not find the stand-in either"
      end
      return r
    end,
  },
  curl_check("secrets.upstream_name",
    "an upstream whose certificate names another host never gets the request (nor the value)",
    "curl https://wrong.test:P/<marker> with the stand-in (wrong.test is bound, its server's certificate names "
      .. "bound.test and other.test)", 'https://wrong.test:%d/%s -H "Authorization: token $CF_TOKEN"', "p"),
}
