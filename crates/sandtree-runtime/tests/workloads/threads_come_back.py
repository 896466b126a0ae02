# threads_come_back: three threads besides the main one (which serves): a
# worker blocked on a queue (a futex wait) that has done one item, a ticker
# sleeping in a loop (its OS name set to `tick-os`), and `timed`, blocked in
# a futex wait with a deadline.
# Commands: `state` -> `done=<worker results> tids=<task ids> names=<Python
# thread names> comms=<OS thread names>`; `work` -> one more item for the
# worker: `done=`; `timed` -> one item for `timed`: `got2=`; `ticking` ->
# `ticking=<the ticker ticked within 100 ms>`; `join` -> stops the worker
# and joins it: `joined=`.
import queue, threading
q = queue.Queue()
done = []
ticks = [0]
acc = [1.0]

def ticker():
    import ctypes
    ctypes.CDLL(None).prctl(15, b'tick-os', 0, 0, 0)  # its OS name
    while True:
        time.sleep(0.01)
        acc[0] = acc[0] * 1.0000001 + 0.5
        ticks[0] += 1

def worker():
    while True:
        item = q.get()
        if item is None:
            return
        done.append(item * 2)

q2 = queue.Queue()
got2 = []

def timed_waiter():
    # A futex wait with a deadline: interrupted, it cannot restart through
    # its restart block after a restore (EINTR instead, retried by Python).
    while True:
        try:
            got2.append(q2.get(timeout=600))
        except queue.Empty:
            pass

threading.Thread(target=timed_waiter, name='timed', daemon=True).start()
threading.Thread(target=ticker, name='ticker', daemon=True).start()
w = threading.Thread(target=worker, name='worker')
w.start()
q.put(1)
while not done:
    time.sleep(0.01)

def handle(cmd):
    if cmd == 'state':
        tasks = sorted(os.listdir('/proc/self/task'))
        comms = sorted(open('/proc/self/task/%s/comm' % t).read().strip() for t in tasks)
        return 'done=%s tids=%s names=%s comms=%s' % (done, tasks,
            sorted(t.name for t in threading.enumerate()), comms)
    if cmd == 'work':
        q.put(len(done) + 10)
        for _ in range(200):
            if len(done) > 1:
                break
            time.sleep(0.01)
        return 'done=%s' % done
    if cmd == 'timed':
        q2.put('x')
        for _ in range(200):
            if got2:
                break
            time.sleep(0.01)
        return 'got2=%s' % got2
    if cmd == 'ticking':
        a = ticks[0]
        time.sleep(0.1)
        return 'ticking=%s' % (ticks[0] > a)
    if cmd == 'join':
        q.put(None)
        w.join(2)
        return 'joined=%s' % (not w.is_alive())
    raise ValueError(cmd)

serve(handle)
