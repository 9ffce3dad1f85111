# Keep-alive HTTP load for the trial scripts: THREADS threads GET PATH on 127.0.0.1:PORT for SECONDS.
# With USERS set, thread i sends `x-user-id: user-<i % USERS>`. Prints the responses by status (and
# per user when USERS is set), the max latency, requests by second and failures (non-2xx/429) by
# second. With CSV, also one line per response there: unix time sent, user, latency ms, status (for
# scripts/cluster_p99.py).
#
#   python3 scripts/http_load.py PORT PATH THREADS SECONDS [USERS [CSV]]
import collections
import http.client
import sys
import threading
import time

port, path, threads, secs = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
users = int(sys.argv[5]) if len(sys.argv) > 5 else 0
csv = sys.argv[6] if len(sys.argv) > 6 else None
rows = []
lock = threading.Lock()
statuses = collections.Counter()
by_user = collections.defaultdict(collections.Counter)
per_sec = collections.Counter()
failed_per_sec = collections.Counter()
max_latency = [0.0]
start = time.time()
stop = start + secs


def worker(i):
    headers = {"x-user-id": f"user-{i % users}"} if users else {}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    local, user, lsec, lfail, lmax = (collections.Counter(), collections.Counter(),
                                      collections.Counter(), collections.Counter(), 0.0)
    mine = []
    while True:
        t = time.time()
        if t >= stop:
            break
        try:
            conn.request("GET", path, headers=headers)
            r = conn.getresponse()
            r.read()
            st = r.status
        except Exception as e:
            st = type(e).__name__
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        lmax = max(lmax, time.time() - t)
        if csv:
            mine.append(f"{t:.6f},{headers.get('x-user-id', '')},{(time.time() - t) * 1000:.3f},{st}\n")
        local[st] += 1
        user[st] += 1
        lsec[int(t - start)] += 1
        if st not in (200, 429):
            lfail[int(t - start)] += 1
    with lock:
        statuses.update(local)
        if users:
            by_user[headers["x-user-id"]].update(user)
        per_sec.update(lsec)
        failed_per_sec.update(lfail)
        max_latency[0] = max(max_latency[0], lmax)
        rows.extend(mine)


ts = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
[t.start() for t in ts]
[t.join() for t in ts]
print("statuses:", dict(statuses), "max latency %.1f ms" % (max_latency[0] * 1000))
for u in sorted(by_user):
    print(f"  {u}: {dict(by_user[u])}")
print("requests by second:", [per_sec[i] for i in range(int(secs))])
print("failures by second:", [failed_per_sec[i] for i in range(int(secs))])
if csv:
    with open(csv, "w") as f:
        f.writelines(rows)
