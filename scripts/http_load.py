# Keep-alive HTTP load: N threads GET a path for D seconds; prints status counts, max latency and
# per-second throughput. usage: load.py PORT PATH THREADS SECONDS
import http.client, sys, threading, time, collections
port, path, threads, secs = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
lock = threading.Lock()
statuses = collections.Counter(); per_sec = collections.Counter(); maxlat = [0.0]
start = time.time(); stop = start + secs
def worker():
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    local = collections.Counter(); lsec = collections.Counter(); lmax = 0.0
    while True:
        t = time.time()
        if t >= stop: break
        try:
            conn.request("GET", path); r = conn.getresponse(); r.read(); st = r.status
        except Exception as e:
            st = type(e).__name__; conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        d = time.time() - t
        local[st] += 1; lsec[int(t - start)] += 1; lmax = max(lmax, d)
    with lock:
        statuses.update(local); per_sec.update(lsec); maxlat[0] = max(maxlat[0], lmax)
ts = [threading.Thread(target=worker) for _ in range(threads)]
[t.start() for t in ts]; [t.join() for t in ts]
print("statuses:", dict(statuses), "max latency %.1f ms" % (maxlat[0] * 1000))
print("req/s by second:", [per_sec[i] for i in range(int(secs))])
