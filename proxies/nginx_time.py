"""nginx's own clocks: only what its access log carries, read from the
lines appended in the window (as nginx would read the file).

nginx OSS keeps no queue of requests: a worker reads every connection it
accepts at once (the wait before that is the kernel's accept queue), and
the upstream `queue` directive is NGINX Plus only (ngx_http_upstream_module
documentation). It keeps no timing counters either (stub_status counts
connections): the times are the log's variables, when its log_format has
them (ngx_http_upstream_module "Embedded Variables", nginx 1.22
src/http/ngx_http_upstream.c): $upstream_connect_time and
$upstream_header_time both count from the start of connecting to the
upstream (u->start_time, set in ngx_http_upstream_connect), up to the
connection and up to the response header; so the origin's first byte is
header - connect. $request_time runs from the first bytes read from the
client to the log. All of them in seconds with ms resolution, taken from
the worker's cached clock (ngx_current_msec, updated once per event-loop
pass): a late loop shows in them. Several upstreams tried for one request
are listed comma-separated (", "), internal redirects with " : ".
"""

import re

from .base import option
from .timing import (MAX_VALUES, Unavailable, Window, answer, decimal, digest, nothing, origin_entry, parse_line, part,
                     split_address, spread, template_regex, unmeasurable)

TIMES = ("upstream_connect_time", "upstream_header_time", "request_time")
NO_QUEUE = ("nginx OSS has no request queue: a worker reads each connection it accepts at once (the wait before "
            "is the kernel's accept queue); upstream `queue` is NGINX Plus only")
COMBINED = ('$remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent "$http_referer" '
            '"$http_user_agent"')
VAR = re.compile(r"\$(?:\{([A-Za-z0-9_]{1,64})\}|([A-Za-z0-9_]{1,64}))")
MECH = "nginx access log"


def statements(lines) -> list[tuple[list[str], str]]:
    """The config's statements (words, with quoted strings kept whole) and the file:line of each start."""
    out, words, start = [], [], None
    for ln in lines:
        for tok in re.findall(r"'[^']*'|\"[^\"]*\"|[;{}]|[^\s;{}'\"]+", ln.text.split("#", 1)[0]
                              if "'" not in ln.text and '"' not in ln.text else ln.text):
            if tok in (";", "{", "}"):
                if words:
                    out.append((words, start))
                words, start = [], None
                continue
            if start is None:
                start = f"{ln.file}:{ln.number}"
            words.append(tok)
        if len(out) > 20000:
            break
    return out


def formats_and_logs(lines) -> tuple[dict, list[dict]]:
    formats = {"combined": {"text": COMBINED, "where": "built-in"}}
    logs = []
    for words, where in statements(lines):
        if words[0] == "log_format" and len(words) > 2:
            body = [w for w in words[2:] if not w.startswith("escape=")]
            formats[words[1]] = {"text": "".join(w[1:-1] if w[:1] in "'\"" else w for w in body), "where": where}
        elif words[0] == "access_log" and len(words) > 1:
            logs.append({"path": words[1].strip("'\""), "format": words[2] if len(words) > 2 and "=" not in words[2]
                         else "combined", "buffered": any(w.startswith("buffer=") for w in words[2:]),
                         "where": where})
    return formats, logs


def tokens(fmt: str) -> list[tuple[str, str]]:
    out, i = [], 0
    for m in VAR.finditer(fmt):
        if m.start() > i:
            out.append(("lit", fmt[i:m.start()]))
        out.append(("field", m.group(1) or m.group(2)))
        i = m.end()
    if i < len(fmt):
        out.append(("lit", fmt[i:]))
    return out


def choose_log(proxy) -> dict:
    """The file log whose format carries the most of the timing variables, or why none does."""
    formats, logs = formats_and_logs(proxy.lines)
    best, why = None, "no access_log"
    for log in logs:
        if log["path"] in ("off",) or log["path"].startswith(("syslog:", "memory:")):
            why = f"access_log {log['path']} ({log['where']}): not a file"
            continue
        fmt = formats.get(log["format"])
        if not fmt:
            continue
        have = [v for v in TIMES + ("upstream_addr",) if re.search(rf"\$\{{?{v}\b", fmt["text"])]
        if not log["path"].startswith("/"):        # relative to nginx's prefix (-p, Debian's /usr/share/nginx)
            log["path"] = f"{(option(proxy.argv, '-p') or ['/usr/share/nginx'])[0].rstrip('/')}/{log['path']}"
        if best is None or len(have) > len(best["have"]):
            best = {**log, "text": fmt["text"], "format_where": fmt["where"], "have": have}
    if best and not best["have"]:
        return {"why": f"the log_format {best['format']} ({best['format_where']}) of {best['path']} has none of "
                       "$request_time, $upstream_connect_time, $upstream_header_time"}
    return best or {"why": why}


class Clock(Window):
    def __init__(self, proxy, log: dict):
        super().__init__(proxy)
        self.log = log
        self.source = f"{log['path']} (log_format {log['format']})"

    def begin(self):
        self.data["log"] = {k: v for k, v in self.log.items() if k != "text"}
        self.data["upstreams"] = upstream_lines(self.proxy.lines)
        self.proxy.appended(self.log["path"])

    def end(self):
        self.data["lines"] = read_lines(self.proxy.appended(self.log["path"]), self.log["text"])


def upstream_lines(lines) -> dict:
    """ip:port -> (upstream block or proxy_pass, file:line) for every address the config sends to."""
    out, block = {}, None
    for words, where in statements(lines):
        if words[0] == "upstream" and len(words) > 1:
            block = words[1]
        elif words[0] == "server" and block and len(words) > 1:
            out.setdefault(words[1], (f"upstream {block}", where))
        elif words[0] == "proxy_pass" and len(words) > 1:
            m = re.match(r"https?://([0-9.]+:[0-9]{1,5})", words[1])
            if m:
                out.setdefault(m.group(1), (f"proxy_pass {words[1][:100]}", where))
    return dict(list(out.items())[:64])


def _seconds(text: str | None) -> float | None:
    """The sum of a variable's values (several upstreams, redirects) in ms; None for '-' or junk."""
    if not text:
        return None
    vals = [decimal(v.strip()) for v in re.split(r",|:", text)]
    if not vals or any(v is None for v in vals):
        return None
    return sum(vals) * 1000


def read_lines(text: str, fmt: str) -> dict:
    lf = template_regex(tokens(fmt), frozenset(v for v in re.findall(r"upstream_\w+", fmt)))
    if lf is None:
        return {"understood": False}
    have = set(lf.groups)
    total, connect, first, by, unread, read = [], [], [], {}, 0, 0
    for line in text.splitlines()[:MAX_VALUES]:
        f = parse_line(lf, line)
        if f is None:
            unread += 1
            continue
        read += 1
        ct, ht, rt = (_seconds(f.get(k)) for k in TIMES)
        if rt is not None:
            total.append(rt)
        if ct is not None:
            connect.append(ct)
        if ht is not None and ct is not None and ht >= ct:
            first.append(ht - ct)
            addr = re.split(r",| : ", f.get("upstream_addr") or "")[-1].strip()
            if re.fullmatch(r"[0-9A-Fa-f.:\[\]]{3,47}", addr):
                by.setdefault(addr, []).append(ht - ct)
    return {"understood": True, "fields": sorted(have & set(TIMES + ("upstream_addr",))),
            "lines": read, "unread": unread,
            "total": spread(total), "connect": digest(connect), "first_byte": digest(first),
            "origins": {a: digest(v) for a, v in list(by.items())[:64]}}



def timing(proxy) -> Window:
    log = choose_log(proxy)
    if log.get("why"):
        return Unavailable(proxy, log["why"])
    return Clock(proxy, log)


# ---------------------------------------------------------------- pure

def parts(p: dict) -> dict:
    t = p.get("timing") or {}
    queue = unmeasurable(NO_QUEUE, "nginx 1.22 (no request queue in OSS)")
    lines, log = t.get("lines") or {}, t.get("log") or {}
    if not t.get("available") or not lines.get("understood"):
        why = t.get("reason") or ("the log_format is not understood" if t.get("available") else
                                  "nginx's access log was not read in this window")
        got = nothing(why, MECH)
        got["parts"]["proxy_queue"] = queue
        return got
    n = lines.get("lines") or 0
    named = f"{log.get('path')} (log_format {log.get('format')}, {log.get('format_where')})"
    source = f"requests logged to {log.get('path')} in the window"
    if not n:
        got = nothing(f"no request was logged to {named} in the window", MECH)
        got["parts"]["proxy_queue"] = queue
        return {**got, "requests": {"n": 0, "source": source}}
    prec = f"ms resolution of the worker's cached clock, each request logged in the window ({named})" + (
        "; a buffered log (buffer=) writes late" if log.get("buffered") else "")
    tot = lines["total"]
    total = (part(tot["mean"], f"{MECH} $request_time: first client bytes read to the log", prec, samples=tot["n"],
                  requests=tot["n"], p50=tot["p50"], p99=tot["p99"])
             if "request_time" in lines["fields"] and tot["n"] else unmeasurable(f"{named} has no $request_time", MECH))
    ups = t.get("upstreams") or {}
    out = {"proxy_queue": queue}
    for name, key, what in (("origin_connect", "connect", "$upstream_connect_time"),
                            ("origin_first_byte", "first_byte", "$upstream_header_time - $upstream_connect_time")):
        d = lines[key]
        if not d["n"]:
            out[name] = unmeasurable(f"{named} has no {what.split(' ')[0]}, or no request went upstream", MECH)
            continue
        by = {(split_address(a) or a): origin_entry((ups.get(a) or ("upstream",))[0], (ups.get(a) or (0, None))[1],
                                                    v["sum_ms"] / v["n"], v["n"])
              for a, v in lines["origins"].items() if v["n"]} if key == "first_byte" else None
        out[name] = part(d["sum_ms"] / d["n"], f"{MECH} {what}", prec, samples=d["n"], requests=d["n"],
                         population="requests that went upstream", by_origin=by, p50=d["p50"], p99=d["p99"])
    return answer(out, total, n, source)


def config_origins(lines) -> dict:
    return {addr: {"name": name, "where": where} for a, (name, where) in upstream_lines(lines).items()
            if (addr := split_address(a))}
