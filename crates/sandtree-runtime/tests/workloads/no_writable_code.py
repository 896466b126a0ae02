# no_writable_code: a process under PR_SET_MDWE (it may not map writable
# code), with a counter, cwd /tmp and /tmp/mdwe.log open (4 bytes written).
# Commands: `state` -> `n= cwd= pos=<log offset> mdwe=<MDWE of
# /proc/self/status> rwx_refused=<a writable executable mapping is
# refused>`; `mutate` -> n + 1, cwd /, a line to the log: `n=`.
import ctypes, mmap
libc = ctypes.CDLL(None, use_errno=True)
PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN = 65, 1
if libc.prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN, 0, 0, 0) != 0:
    raise OSError(ctypes.get_errno(), 'prctl(PR_SET_MDWE)')
data = {'n': 1}
os.chdir('/tmp')
log = open('/tmp/mdwe.log', 'a+')
log.write('one\n')
log.flush()

def rwx_refused():
    try:
        mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
        return False
    except OSError:
        return True

def handle(cmd):
    if cmd == 'state':
        return 'n=%d cwd=%s pos=%d mdwe=%s rwx_refused=%s' % (
            data['n'], os.getcwd(), log.tell(), status('MDWE') if status('MDWE') else '?', rwx_refused())
    if cmd == 'mutate':
        data['n'] += 1
        os.chdir('/')
        log.write('two\n')
        log.flush()
        return 'n=%d' % data['n']
    raise ValueError(cmd)

serve(handle)
