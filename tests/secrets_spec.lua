-- Secrets the tenant never holds (`corral run --secret`, corral.egress.secrets): real
-- clients in a native tenant (curl, python3 urllib and http.client, git, node's fetch)
-- against HTTPS and HTTP servers this file starts on loopback, under a CA it makes with
-- openssl. The servers log every request they receive: what reached them is what the
-- tests judge. Every refusal runs before a control in the same run.
local h = require "helpers"

local REAL = "ghp_RealValue0123456789abcdefABCDEFghij42"
local OTHER = "sk-ant-OtherValue0123456789abcdefXYZ"

describe("secrets #netns", function()
  local dir, https_port, http_port, h2_port, servers

  local function sh(script)
    local out, status = h.sh(script)
    assert(status == 0, out)
    return out
  end

  -- A server of tests/fixtures/secrets_server.py in the background; its pid.
  local function start_server(port, log, tls, cmd)
    cmd = cmd or string.format("/usr/bin/python3 %s/tests/fixtures/secrets_server.py %d %s %s %s/bare%s",
      os.getenv("PWD"), port, log, REAL, dir, tls and (" " .. dir .. "/srv.pem " .. dir .. "/srv.key") or "")
    local p = assert(io.popen(cmd .. " > " .. log .. ".out 2>&1 & echo $!"))
    local pid = p:read("l")
    p:close()
    assert(h.wait_for(function() return (h.read(log .. ".out") or ""):find("ready", 1, true) end, 5),
      h.read(log .. ".out"))
    return pid
  end

  setup(function()
    dir = h.tmpdir("secrets")
    -- the test's CA, and a server certificate for api.test and b.test (not wrong.test)
    sh(string.format([[cd %s && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
      -keyout ca.key -out ca.pem -days 2 -subj /CN=secrets-test-ca 2>&1 && \
      openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout srv.key -out srv.csr \
      -subj /CN=api.test 2>&1 && printf 'subjectAltName=DNS:api.test,DNS:b.test\n' > ext && \
      openssl x509 -req -in srv.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out srv.pem -days 2 \
      -extfile ext 2>&1 && \
      git init -q --bare bare && git init -q work && cd work && echo hello > README && git add README && \
      git -c user.name=t -c user.email=t@t commit -qm first && git push -q ../bare HEAD:main 2>&1 && \
      cd ../bare && git symbolic-ref HEAD refs/heads/main && git update-server-info]], dir))
    https_port, http_port, h2_port = h.free_port(), h.free_port(), h.free_port()
    servers = { start_server(https_port, dir .. "/https.log", true), start_server(http_port, dir .. "/http.log") }
    if os.execute("command -v node >/dev/null") then
      servers[3] = start_server(h2_port, dir .. "/h2.log", true,
        string.format("node %s/tests/fixtures/secrets_h2_server.js %d %s %s/srv.pem %s/srv.key", os.getenv("PWD"),
          h2_port, dir .. "/h2.log", dir, dir))
    end
  end)

  teardown(function()
    for _, pid in ipairs(servers or {}) do os.execute("kill " .. pid) end
    if dir then h.rmrf(dir) end
  end)

  -- `corral run` with api.test, b.test, wrong.test (HTTPS), plain.test (HTTP) and
  -- *.api.test allowed, GITHUB_TOKEN bound to api.test and OTHER_KEY to b.test; o.args
  -- added, o.env more of corral's variables, o.no_ca without the test's CA.
  local function run(script, o)
    o = o or {}
    local argv = { "env", "GITHUB_TOKEN=" .. REAL, "OTHER_KEY=" .. OTHER }
    for _, e in ipairs(o.env or {}) do argv[#argv + 1] = e end
    for _, a in ipairs({ h.host, "run",
      "--allow", "api.test:" .. https_port, "--allow", "b.test:" .. https_port, "--allow", "wrong.test:" .. https_port,
      "--allow", "plain.test:" .. http_port, "--allow", "*.api.test", "--allow", "api.test:" .. h2_port,
      "--internal", "127.0.0.0/8", "--resolve", "api.test=127.0.0.1", "--resolve", "b.test=127.0.0.1",
      "--resolve", "wrong.test=127.0.0.1", "--resolve", "plain.test=127.0.0.1",
      "--secret", "GITHUB_TOKEN@api.test:" .. https_port .. ",api.test:" .. h2_port,
      "--secret", "OTHER_KEY@b.test:" .. https_port,
      "--log-json", dir .. "/events.jsonl" }) do
      argv[#argv + 1] = a
    end
    if not o.no_ca then
      argv[#argv + 1], argv[#argv + 2] = "--ca-file", dir .. "/ca.pem"
    end
    for _, a in ipairs(o.args or {}) do argv[#argv + 1] = a end
    local vars = string.format("P=%d; Q=%d; H=%d; ", https_port, http_port, h2_port)
    for _, a in ipairs({ "--", "sh", "-c", vars .. script }) do argv[#argv + 1] = a end
    os.remove(dir .. "/events.jsonl")
    return h.capture(argv)
  end

  local function requests(log)
    local json, out = require "dkjson", {}
    for line in (h.read(dir .. "/" .. log) or ""):gmatch("[^\n]+") do out[#out + 1] = assert(json.decode(line)) end
    return out
  end

  local function events()
    local json, out = require "dkjson", {}
    for line in (h.read(dir .. "/events.jsonl") or ""):gmatch("[^\n]+") do out[#out + 1] = assert(json.decode(line)) end
    return out
  end

  local function reset_logs()
    for _, f in ipairs({ "https.log", "http.log", "h2.log" }) do h.write(dir .. "/" .. f, "") end
  end

  it("gives the tenant a stand-in of the same shape, and the bound host the value, from curl, python, git and "
    .. "node", function()
    reset_logs()
    local storage = dir .. "/st1"
    local node = os.execute("command -v node >/dev/null") and
      ([[node -e 'fetch("https://api.test:"+process.env.P+"/node", ]]
        .. [[{headers: {authorization: "Bearer " + process.env.GITHUB_TOKEN}}).then(r => r.text())]]
        .. [[.then(t => process.stdout.write("node:" + t))'; ]])
      or ""
    local out, status = run([[
      export P; echo "standin=$GITHUB_TOKEN"
      curl -sS https://api.test:$P/curl -H "Authorization: token $GITHUB_TOKEN"
      /usr/bin/python3 -c 'import os, urllib.request as u
print("py:" + u.urlopen(u.Request("https://api.test:%s/py" % os.environ["P"],
  headers={"Authorization": "Bearer " + os.environ["GITHUB_TOKEN"]})).read().decode(), end="")'
      ]] .. node .. [[
      git clone -q "https://x-access-token:$GITHUB_TOKEN@api.test:$P/repo.git" /tmp/clone && cat /tmp/clone/README
      # everything corral could have left the value in, for the host to search
      { env; cat /proc/[0-9]*/environ /proc/[0-9]*/cmdline;
        find /etc /storage /tmp /run /dev/shm -xdev -type f -size -4M -readable -exec cat {} + ; } \
        > /tmp/dump 2>/dev/null; cp /tmp/dump /storage/dump
      grep -c "BEGIN CERTIFICATE" "$SSL_CERT_FILE" >/dev/null && echo "bundle=$SSL_CERT_FILE"
    ]], { args = { "--storage", storage } })
    assert.are.equal(0, status, out)
    local stand_in = out:match("standin=(%S+)")
    assert.truthy(stand_in and stand_in ~= REAL and #stand_in == #REAL and stand_in:sub(1, 4) == "ghp_", out)
    assert.is_nil(stand_in:sub(5):find("[^%w]"), stand_in)
    assert.matches("ok GET /curl", out, 1, true)
    assert.matches("py:ok GET /py", out, 1, true)
    assert.matches("hello", out, 1, true) -- git's clone, with the token as its password
    assert.matches("bundle=/etc/ssl/certs/ca-certificates.crt", out, 1, true)
    -- the summary counts the requests and those that carried the value
    local n, used = out:match("terminated TLS: api%.test: (%d+) requests, (%d+) with a secret put in")
    assert.truthy(n and tonumber(n) >= 4 and tonumber(used) >= 3, out)
    local dump = assert(h.read(storage .. "/dump"))
    assert.truthy(#dump > 10000 and dump:find(stand_in, 1, true), "the dump holds the stand-in")
    assert.is_nil(dump:find(REAL, 1, true), "the real value is readable inside")
    assert.is_nil(dump:find("PRIVATE KEY", 1, true), "a private key is readable inside")
    assert.is_nil(out:find(REAL, 1, true))
    local seen = {}
    for _, r in ipairs(requests("https.log")) do
      seen[r.path] = r.headers.Authorization or r.headers.authorization or ""
    end
    assert.are.equal("token " .. REAL, seen["/curl"])
    assert.are.equal("Bearer " .. REAL, seen["/py"])
    if node ~= "" then assert.are.equal("Bearer " .. REAL, seen["/node"]) else pending("node is not installed") end
    assert.truthy(seen["/repo.git/HEAD"] and seen["/repo.git/HEAD"]:find("^Basic "), "git sent no credentials")
    -- each request logged, with whether a secret was put in, never its value
    local logged = {}
    for _, e in ipairs(events()) do
      if e.kind == "request" then logged[e.path] = e end
    end
    assert.truthy(logged["/curl"] and logged["/curl"].secret_used == true and logged["/curl"].status == 200)
    assert.are.equal("GET", logged["/curl"].method)
    assert.is_nil((h.read(dir .. "/events.jsonl") or ""):find(REAL, 1, true))
    h.rmrf(storage)
  end)

  it("gives Python's requests (where Debian's python3 has it) the value toward the bound host", function()
    if not os.execute("/usr/bin/python3 -c 'import requests' 2>/dev/null") then
      return pending("python3-requests is not installed")
    end
    reset_logs()
    local out, status = run([[
      export P; /usr/bin/python3 -c 'import os, requests
r = requests.get("https://api.test:%s/requests" % os.environ["P"],
                 headers={"Authorization": "token " + os.environ["GITHUB_TOKEN"]})
print("requests:" + r.text, end="")']])
    assert.are.equal(0, status, out)
    assert.matches("requests:ok GET /requests", out, 1, true)
    assert.are.equal("token " .. REAL, requests("https.log")[1].headers.Authorization)
  end)

  it("gives gh api (GH_HOST with a port, GH_ENTERPRISE_TOKEN bound) the value toward the bound host", function()
    if not os.execute("command -v gh >/dev/null") then return pending("gh is not installed") end
    reset_logs()
    local out, status = run([[HOME=/tmp GH_HOST=api.test:$P gh api /user; echo "rc=$?"]],
      { env = { "GH_ENTERPRISE_TOKEN=" .. REAL },
        args = { "--secret", "GH_ENTERPRISE_TOKEN@api.test:" .. https_port } })
    assert.are.equal(0, status, out)
    assert.matches("ok GET /api/v3/user\nrc=0", out, 1, true)
    local got = requests("https.log")
    assert.are.equal(1, #got)
    assert.are.equal("token " .. REAL, got[1].headers.Authorization)
    assert.matches("GitHub CLI", got[1].headers["User-Agent"], 1, true)
  end)

  it("refuses the stand-in anywhere but a bound host's headers, each attempt then its control", function()
    reset_logs()
    local out, status = run([[
      export P; T=$GITHUB_TOKEN
      echo "query:"; curl -sS "https://api.test:$P/q?t=$T"
      echo "body:"; curl -sS https://api.test:$P/body -d "tok=$T"
      echo "other:"; curl -sS https://b.test:$P/other -H "Authorization: token $T"
      echo "plain:"; curl -sS http://plain.test:$Q/plain -H "Authorization: token $T"
      echo "plainbound:"; curl -sS http://api.test:$P/plainbound -H "Authorization: token $T"; echo "rc=$?"
      echo "dns:"; getent hosts "$T.api.test"; echo "dns=$?"
      echo "host:"; curl -sS https://api.test:$P/host -H "Host: b.test"
      echo "name:"; curl -sS https://api.test:$P/name -H "X-$T: 1"
      /usr/bin/python3 - <<'PY'
import http.client, os
c = http.client.HTTPSConnection("api.test", int(os.environ["P"]))
c.request("GET", "/first", headers={"Authorization": "token " + os.environ["GITHUB_TOKEN"]})
r = c.getresponse(); print("first", r.status, r.read().decode().strip())
c.request("GET", "/second", headers={"Host": "b.test"})
r = c.getresponse(); print("second", r.status, r.read().decode().strip())
PY
      echo "control:"; curl -sS https://api.test:$P/control -H "Authorization: token $T"
      curl -sS https://b.test:$P/bcontrol -H "X-Key: $OTHER_KEY"
      curl -sS http://plain.test:$Q/plaincontrol
      getent hosts x.api.test >/dev/null; echo "dnscontrol=$?"
    ]])
    assert.are.equal(0, status, out)
    local function refused(label, why)
      local section = out:match(label .. ":\n([^\n]*)")
      assert.truthy(section and section:find("corral: request refused: ", 1, true) and section:find(why, 1, true),
        label .. ": " .. out)
    end
    refused("query", "in the URL toward api.test")
    refused("body", "in a request body toward api.test")
    refused("other", "toward b.test, a host that secret is not bound to (--secret NAME@b.test would admit it)")
    refused("plain", "in the clear toward plain.test:" .. http_port)
    refused("host", "Host b.test on a connection to api.test")
    refused("name", "in a header's name toward api.test") -- found by tests/fuzz/fuzz_http1.c
    refused("plainbound", "in the clear toward api.test:" .. https_port)
    assert.matches("dns=2", out, 1, true)
    assert.matches("first 200 ok GET /first", out, 1, true)
    assert.matches("second 403 corral: request refused: Host b.test on a connection to api.test", out, 1, true)
    -- the controls, after every attempt, in the same sandbox
    assert.matches("ok GET /control", out, 1, true)
    assert.matches("ok GET /bcontrol", out, 1, true)
    assert.matches("ok GET /plaincontrol", out, 1, true)
    assert.matches("dnscontrol=0", out, 1, true)
    -- nothing refused reached a server; the controls did, with the values
    local paths = {}
    for _, f in ipairs({ "https.log", "http.log" }) do
      for _, r in ipairs(requests(f)) do paths[r.path:gsub("%?.*", "")] = r end
    end
    for _, p in ipairs({ "/q", "/body", "/other", "/plain", "/plainbound", "/host", "/name", "/second" }) do
      assert.is_nil(paths[p], p .. " reached a server")
    end
    assert.are.equal("token " .. REAL, paths["/control"].headers.Authorization)
    assert.are.equal(OTHER, paths["/bcontrol"].headers["X-Key"])
    assert.truthy(paths["/first"] and paths["/plaincontrol"])
    -- every refusal of a stand-in is logged as an attempted leak
    local leaks = 0
    for _, e in ipairs(events()) do
      if e.verdict == "deny" and e.leak then leaks = leaks + 1 end
    end
    assert.truthy(leaks >= 7, "leaks logged: " .. leaks)
  end)

  it("checks every HTTP/2 stream: a second stream naming another :authority refused, the first and a later one "
    .. "(controls) on the same connection answered with the value", function()
    if not servers[3] then return pending("node is not installed (the HTTP/2 test server)") end
    reset_logs()
    local out, status = run([[
      T=$GITHUB_TOKEN; W=' %{http_version} %{num_connects}\n'
      curl -sS --http2 https://api.test:$H/one -H "Authorization: token $T" -w "$W" \
        --next --http2 https://api.test:$H/two -H "Host: b.test" -w "$W" \
        --next --http2 https://api.test:$H/three -H "Authorization: token $T" -w "$W"
      echo "path:"; curl -sS --http2 "https://api.test:$H/p?t=$T"
      echo "body:"; curl -sS --http2 https://api.test:$H/b -d "t=$T"
      echo "trailers:"; curl -sS --http2 https://api.test:$H/trailers -d x=1 -D - -w "$W" |
        tr -d '\r' | grep -E '^(ok|x-check| 2)'
      echo "h1:"; curl -sS --http1.1 https://api.test:$H/h1 -H "Authorization: token $T" -w "$W"
      echo "fallback:"; curl -sS --http2 https://api.test:$P/fallback -H "Authorization: token $T" -w "$W"
      head -c 3000000 /dev/zero | tr '\0' a > /tmp/big; cp /tmp/big /tmp/bigleak; printf %s "$T" >> /tmp/bigleak
      echo "bigleak:"; curl -sS --http2 https://api.test:$H/bigleak --data-binary @/tmp/bigleak
      echo "big:"; curl -sS --http2 https://api.test:$H/big --data-binary @/tmp/big
      echo "last:"; curl -sS --http2 https://api.test:$H/slowend
    ]])
    assert.are.equal(0, status, out)
    assert.matches("ok h2.0 GET /one\n 2 1\n", out, 1, true)
    assert.matches("corral: request refused: :authority b.test on a connection to api.test (each request on it must "
      .. "name api.test)\n 2 0\n", out, 1, true)
    assert.matches("ok h2.0 GET /three\n 2 0\n", out, 1, true) -- the same connection, after the refusal
    assert.matches("path:\ncorral: request refused: a secret's stand-in in the URL toward api.test", out, 1, true)
    assert.matches("body:\ncorral: request refused: a secret's stand-in in a request body toward api.test", out, 1,
      true)
    assert.matches("trailers:\nok h2.0 POST /trailers\nx-check: done\n 2 1", out, 1, true)
    assert.matches("h1:\nok h1.1 GET /h1\n 1.1 1", out, 1, true)
    -- a server without HTTP/2: the tenant is offered HTTP/1.1 alone
    assert.matches("fallback:\nok GET /fallback\n 1.1 1", out, 1, true)
    local got = {}
    for _, r in ipairs(requests("h2.log")) do got[r.path:gsub("%?.*", "")] = r end
    for _, p in ipairs({ "/two", "/p", "/b" }) do assert.is_nil(got[p], p .. " reached the server") end
    assert.are.equal("token " .. REAL, got["/one"].headers.authorization)
    assert.are.equal("token " .. REAL, got["/three"].headers.authorization)
    assert.are.equal("2.0", got["/three"].version)
    assert.are.equal("x=1", got["/trailers"].body)
    assert.are.equal("token " .. REAL, got["/h1"].headers.authorization)
    local denied, leaks, allowed = {}, 0, {}
    for _, e in ipairs(events()) do
      if e.kind == "request" and e.verdict == "deny" then
        denied[e.path] = e.reason
        leaks = leaks + (e.leak and 1 or 0)
      end
      if e.kind == "request" and e.verdict == "allow" then allowed[e.path] = e end
    end
    assert.matches(":authority b.test", denied["/two"] or "", 1, true)
    assert.are.equal(3, leaks) -- the path, the body, the big body
    assert.truthy(allowed["/one"] and allowed["/one"].secret_used and allowed["/one"].status == 200)
    assert.are.equal(3, allowed["/trailers"].bytes_up)
    -- the last request, whose client had its whole body before the stream's end: logged
    -- before the run ended
    assert.matches("last:\nok h2.0 GET /slowend\n", out, 1, true)
    -- a body past the 1 MiB held streams; a stand-in at its end resets the upstream stream
    assert.matches("bigleak:\ncorral: request refused: a secret's stand-in in a request body", out, 1, true)
    assert.matches("big:\nok h2.0 POST /big\n", out, 1, true)
    assert.are.equal(3000000, #got["/big"].body)
    -- (node logs an aborted stream's partial body: never its end, which carried the stand-in)
    local leaked = got["/bigleak"] and got["/bigleak"].body or ""
    assert.is_true(#leaked < 3000000 and not leaked:find("ghp_", 1, true), "the stand-in's bytes reached the server")
    assert.truthy(allowed["/slowend"] and allowed["/slowend"].status == 200, "the last request was not logged")
  end)

  it("holds request rules (--allow https://HOST/PATH, --method) on HTTP/2 and HTTP/1.1, each refusal before its "
    .. "control", function()
    if not servers[3] then return pending("node is not installed (the HTTP/2 test server)") end
    reset_logs()
    local out, status = run([[
      T=$GITHUB_TOKEN; A="Authorization: token $T"
      echo "path:"; curl -sS --http2 https://api.test:$H/repos/other -H "$A"
      echo "dot:"; curl -sS --http1.1 --path-as-is https://api.test:$H/repos/acme/../other -H "$A"
      echo "method:"; curl -sS --http2 -X DELETE https://api.test:$H/repos/acme/p -H "$A"
      echo "method1:"; curl -sS -X DELETE https://api.test:$P/elsewhere -H "$A"
      echo "control:"; curl -sS --http2 https://api.test:$H/repos/acme/x -H "$A"
      curl -sS --http1.1 https://api.test:$H/repos/acme/y -H "$A"
      curl -sS -o /dev/null -w "head=%{http_code}\n" --http2 -I https://api.test:$H/repos/acme/z
      curl -sS https://api.test:$P/elsewhere -H "$A"
    ]], { args = { "--allow", "https://api.test:" .. h2_port .. "/repos/acme/*", "--method", "GET,HEAD" } })
    assert.are.equal(0, status, out)
    local where = "api.test:" .. h2_port
    assert.matches("path:\ncorral: request refused: path /repos/other on " .. where .. " is under no --allow https://"
      .. where .. "/... entry (--allow 'https://" .. where .. "/repos/other' would admit it)", out, 1, true)
    assert.matches("dot:\ncorral: request refused: path /repos/acme/../other on " .. where .. " has a dot segment",
      out, 1, true)
    assert.matches("method:\ncorral: request refused: DELETE is not among --method GET,HEAD (--method GET,HEAD,"
      .. "DELETE would admit it)", out, 1, true)
    assert.matches("method1:\ncorral: request refused: DELETE is not among --method", out, 1, true)
    assert.matches("control:\nok h2.0 GET /repos/acme/x\nok h1.1 GET /repos/acme/y\nhead=200\nok GET /elsewhere\n",
      out, 1, true)
    local got = {}
    for _, f in ipairs({ "h2.log", "https.log" }) do
      for _, r in ipairs(requests(f)) do got[#got + 1] = r.method .. " " .. r.path end
    end
    table.sort(got)
    assert.are.same({ "GET /elsewhere", "GET /repos/acme/x", "GET /repos/acme/y", "HEAD /repos/acme/z" }, got)
  end)

  it("asks network.request (header names, never values) under the decide budget: a refusal, an exhausted budget, "
    .. "then the control", function()
    local corral = require "corral"
    local list = assert(require("corral.egress.secrets").parse({ secret = { "GITHUB_TOKEN@api.test:" .. https_port } },
      { GITHUB_TOKEN = REAL }))
    reset_logs()
    local seen, root = {}, h.tmpdir("secrets-hook")
    os.execute("chmod 0711 " .. root)
    local sb = assert(corral.sandbox({ id = "secrets-hook", storage_root = root, network = {
      allow = { "api.test:" .. https_port }, internal = { "127.0.0.0/8" }, resolve = { ["api.test"] = "127.0.0.1" },
      secrets = list, ca_file = dir .. "/ca.pem", budget = 5000,
      request = function(r)
        seen[#seen + 1] = r
        if r.path == "/loop" then while true do end end
        if r.path == "/deny" then return false, "no " .. r.method .. " here" end
        return true
      end } }))
    local ok, err = corral.provision("native", sb)
    if ok then
      ok, err = corral.exec("native", sb, { "sh", "-c", string.format([[
        A="Authorization: token $GITHUB_TOKEN"
        echo "deny:"; curl -sS https://api.test:%d/deny -H "$A"
        echo "loop:"; curl -sS https://api.test:%d/loop -H "$A"
        echo "control:"; curl -sS https://api.test:%d/fine?q=1 -H "$A" -H "X-Trace: 1"
      ]], https_port, https_port, https_port) }, { output = root .. "/out" })
    end
    corral.destroy("native", sb)
    local out = h.read(root .. "/out") or ""
    h.rmrf(root)
    assert(ok, tostring(err and (err.detail or err.message) or err))
    assert.matches("deny:\ncorral: request refused: refused by the network's request hook: no GET here", out, 1, true)
    assert.matches("loop:\ncorral: request refused: refused by the network's request hook: request hook exceeded its "
      .. "budget of 5000 instructions", out, 1, true)
    assert.matches("control:\nok GET /fine?q=1", out, 1, true)
    local got = {}
    for _, r in ipairs(requests("https.log")) do got[#got + 1] = r.path .. " " .. r.headers.Authorization end
    assert.are.same({ "/fine?q=1 token " .. REAL }, got)
    -- the hook saw method, host, port, the path without its query and header names only
    local last = seen[#seen]
    assert.are.same({ "GET", "api.test", https_port, "/fine" }, { last.method, last.host, last.port, last.path })
    table.sort(last.headers)
    assert.are.same({ "accept", "authorization", "host", "user-agent", "x-trace" }, last.headers)
    for _, r in ipairs(seen) do
      for _, n in ipairs(r.headers) do assert.is_nil(n:find("ghp_", 1, true)) end
    end
  end)

  it("--upstream-proxy: every relayed connection through CONNECT to the address corral checked; a private one "
    .. "refused before any CONNECT, a proxy's refusal a refusal, then the controls", function()
    reset_logs()
    local proxy_port, plog = h.free_port(), dir .. "/proxy.log"
    h.write(plog, "")
    local pid = start_server(proxy_port, plog, false, string.format(
      "/usr/bin/python3 %s/tests/fixtures/connect_proxy.py %d %s 127.0.0.2", os.getenv("PWD"), proxy_port, plog))
    local out, status = run([[
      echo "private:"; curl -sS --max-time 5 https://private.test:$P/private; echo "rc=$?"
      echo "refused:"; curl -sS --max-time 5 http://deny.test:$Q/deny; echo "rc=$?"
      echo "control:"; curl -sS https://api.test:$P/via -H "Authorization: token $GITHUB_TOKEN"
      curl -sS http://plain.test:$Q/plainvia
      curl -sS -k https://wrong.test:$P/spliced
    ]], { args = { "--upstream-proxy", "http://127.0.0.1:" .. proxy_port, "--allow", "private.test:" .. https_port,
      "--resolve", "private.test=10.9.9.9", "--allow", "deny.test:" .. http_port,
      "--resolve", "deny.test=127.0.0.2" } })
    os.execute("kill " .. pid)
    assert.are.equal(0, status, out)
    assert.matches("private:\n[^\n]*\nrc=[1-9]", out)
    assert.matches("resolved into a refused range (10.9.9.9: 10.9.9.9 is private", out, 1, true)
    assert.matches("refused:\n[^\n]*\nrc=[1-9]", out)
    assert.matches("control:\nok GET /via\nok GET /plainvia\nok GET /spliced\n", out, 1, true)
    assert.matches("upstream refused 127.0.0.2", out, 1, true)
    -- the proxy was asked for addresses only, never for the private one
    local asked = {}
    for line in h.read(plog):gmatch("[^\n]+") do asked[#asked + 1] = line end
    local want = { "CONNECT 127.0.0.1:" .. http_port .. " HTTP/1.1", "CONNECT 127.0.0.1:" .. https_port
      .. " HTTP/1.1", "CONNECT 127.0.0.1:" .. https_port .. " HTTP/1.1", "CONNECT 127.0.0.2:" .. http_port
      .. " HTTP/1.1" }
    table.sort(asked)
    table.sort(want)
    assert.are.same(want, asked)
    local got = {}
    for _, f in ipairs({ "https.log", "http.log" }) do
      for _, r in ipairs(requests(f)) do got[r.path] = r.headers.Authorization or "" end
    end
    assert.are.same({ ["/via"] = "token " .. REAL, ["/plainvia"] = "", ["/spliced"] = "" }, got)
    local via = 0
    for _, e in ipairs(events()) do
      local through = e.proxy == "http://127.0.0.1:" .. proxy_port
      if e.kind == "connect" and e.verdict == "allow" and through then via = via + 1 end
    end
    assert.truthy(via >= 3, "connect events naming the proxy: " .. via)
  end)

  it("ends cleanly with terminated connections still open at the tenant's exit (their threads joined first)",
    function()
    -- the connection threads then end while the run tears down: one still running when
    -- the module went killed corral (SIGSEGV) about one run in three
    for i = 1, 3 do
      local out, status = run([[
        export P; /usr/bin/python3 - <<'PY'
import os, socket, ssl
ctx = ssl.create_default_context()
held = []
for i in range(40):
    held.append(ctx.wrap_socket(socket.create_connection(("api.test", int(os.environ["P"]))),
                                server_hostname="api.test"))
print("held", len(held), flush=True)
os._exit(0)
PY]])
      assert.are.equal(0, status, "run " .. i .. ": " .. out)
      assert.matches("held 40", out, 1, true)
    end
  end)

  it("refuses an upstream whose certificate names another host (control: the right one), and one no trusted CA "
    .. "signed", function()
    reset_logs()
    local script = [[
      echo "wrong:"; curl -sS https://wrong.test:$P/wrong
      echo "right:"; curl -sS https://api.test:$P/right -H "Authorization: token $GITHUB_TOKEN"
    ]]
    local out, status = run(script, { env = { "WRONG_TOKEN=ghp_WrongValue0123456789abc" },
      args = { "--secret", "WRONG_TOKEN@wrong.test:" .. https_port } })
    assert.are.equal(0, status, out)
    assert.matches("wrong:\ncorral: the certificate of wrong.test does not verify: hostname mismatch (it names "
      .. "another host)", out, 1, true)
    assert.matches("right:\nok GET /right", out, 1, true)
    -- without the test's CA, the same server is refused, saying which flag trusts it
    out, status = run(script, { no_ca = true })
    assert.are.equal(0, status, out)
    assert.matches("right:\ncorral: the certificate of api.test does not verify: unable to get local issuer "
      .. "certificate (--ca-file adds a CA to trust)", out, 1, true)
    local paths = {}
    for _, r in ipairs(requests("https.log")) do paths[#paths + 1] = r.path end
    assert.are.same({ "/right" }, paths)
  end)

  it("holds under bwrap too: the value toward the bound host, a refusal then its control", function()
    if not os.execute("command -v bwrap >/dev/null") then return pending("bwrap is not installed") end
    reset_logs()
    local out, status = run([[
      echo "query:"; curl -sS "https://api.test:$P/bq?t=$GITHUB_TOKEN"
      echo "control:"; curl -sS https://api.test:$P/bcontrol -H "Authorization: token $GITHUB_TOKEN"
      cat /proc/[0-9]*/environ | grep -c "$GITHUB_TOKEN" >/dev/null && echo "standin-seen"
    ]], { args = { "--mechanism", "bwrap" } })
    assert.are.equal(0, status, out)
    assert.matches("query:\ncorral: request refused: a secret's stand-in in the URL", out, 1, true)
    assert.matches("control:\nok GET /bcontrol", out, 1, true)
    assert.matches("standin-seen", out, 1, true)
    local got = {}
    for _, r in ipairs(requests("https.log")) do got[#got + 1] = r.path .. " " .. (r.headers.Authorization or "") end
    assert.are.same({ "/bcontrol token " .. REAL }, got)
  end)

  it("refuses bad --secret, --secret-file and --ca-file values naming the flag (exit 2)", function()
    local file = dir .. "/token"
    h.write(file, REAL .. "\n")
    os.execute("chmod 644 " .. file)
    local base = { "--allow", "api.test:443", "--resolve", "api.test=127.0.0.1", "--internal", "127.0.0.0/8" }
    local cases = {
      { { "--secret", "GITHUB_TOKEN@api.test" }, "--secret", "give --allow", true },
      { { "--secret", "NOPE_UNSET@api.test" }, "--secret", "NOPE_UNSET is not set in corral's environment" },
      { { "--secret", "GITHUB_TOKEN" }, "--secret", "expected NAME@HOST" },
      { { "--secret", "GITHUB_TOKEN@10.0.0.1" }, "--secret", "bind a name, not an address" },
      { { "--secret", "GITHUB_TOKEN@api.test:0" }, "--secret", "a port is 1-65535" },
      { { "--secret", "SHORT@api.test" }, "--secret", "shorter than 8 characters" },
      { { "--secret-file", "T=" .. file .. "@api.test" }, "--secret-file", "lets others read it; chmod 600 it" },
      { { "--secret-file", "T=" .. dir .. "@api.test" }, "--secret-file", "not a regular file" },
      { { "--secret", "GITHUB_TOKEN@api.test", "--env", "GITHUB_TOKEN" }, "--env", "is bound by --secret" },
      { { "--ca-file", dir .. "/ca.pem" }, "--ca-file", "give --secret too" },
      { { "--secret", "GITHUB_TOKEN@api.test", "--allow", "https://b.test/x" }, "--allow",
        "https://b.test/x: a path is enforced only where TLS is terminated: bind a secret to b.test:443" },
      { { "--secret", "GITHUB_TOKEN@api.test", "--allow", "http://api.test/x" }, "--allow",
        "a path is enforced on https:// entries only" },
      { { "--secret", "GITHUB_TOKEN@api.test", "--method", "GET,B@D" }, "--method", '"B@D" is not a method' },
      { { "--method", "GET" }, "--method", "applies to requests on the hosts a --secret is bound to" },
      { { "--upstream-proxy", "socks5://127.0.0.1:1080" }, "--upstream-proxy", "expected http://HOST:PORT" },
      { { "--upstream-proxy", "http://127.0.0.1:1" }, "--upstream-proxy", "give --allow too", true },
      { { "--learn", dir .. "/learned", "--upstream-proxy", "http://127.0.0.1:1" }, "--upstream-proxy",
        "with --learn, which relays nothing", true },
      { { "--upstream-proxy", "http://127.0.0.1:1", "--allow", "udp:ntp.test:123" }, "--upstream-proxy",
        "carries TCP only" },
    }
    for _, c in ipairs(cases) do
      local argv = { "env", "GITHUB_TOKEN=" .. REAL, "SHORT=abc", h.host, "run" }
      if not c[4] then table.move(base, 1, #base, #argv + 1, argv) end
      table.move(c[1], 1, #c[1], #argv + 1, argv)
      table.move({ "--", "true" }, 1, 2, #argv + 1, argv)
      local out, status = h.capture(argv)
      assert.are.equal(2, status, table.concat(c[1], " ") .. ": " .. out)
      assert.matches(c[2] .. ": ", out, 1, true)
      assert.matches(c[3], out, 1, true)
      assert.is_nil(out:find(REAL, 1, true))
    end
    -- control: the same file, 0600, is taken
    os.execute("chmod 600 " .. file)
    local argv = { h.host, "run" }
    table.move(base, 1, #base, #argv + 1, argv)
    table.move({ "--secret-file", "T=" .. file .. "@api.test", "--", "sh", "-c", "echo ${#T} ${T%%_*}" }, 1, 6,
      #argv + 1, argv)
    local out, status = h.capture(argv)
    assert.are.equal(0, status, out)
    assert.matches("^" .. #REAL .. " ghp\n", out)
  end)
end)
