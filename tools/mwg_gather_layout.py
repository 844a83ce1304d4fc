# Checks the copy maps of product_wgg (kernels/cu/products.cu, MWG_GATHER = 1 / 2 / 3) on the CPU:
# every (token n, column k) 16-bit value of a k-tile lands exactly where the wgmma reads it through
# wg_desc (no swizzle: core matrices of 8 x 16 bytes, LBO 128, SBO 256) or wg_desc_sw128 (the
# 128-byte swizzle: address bits [4:6] ^= [7:9], SBO 1024, +32 bytes per k16 step), and counts the
# shared-memory bank conflicts and token rows per warp copy. Run: python3 tools/mwg_gather_layout.py
# (It models the layouts as documented; the H200 bit check, memra-verify product_geom, decides.)
def src_word_cols(w):  # word w of the k-tile row (prep.cuh): 2 columns
    bb, r = divmod(w, 16); t, c = divmod(r, 4); st, h = divmod(c, 2)
    k = 32*bb + 16*st + 8*h + 2*t
    return (k, k+1)
def run(MAP, N, KT):
    STEP = N*32
    for tid in range(256):
        if MAP == 3:
            lane, w = tid & 31, tid >> 5; t = (lane>>2)&3; ch = 4*(lane>>4)+(lane&3)
            d = w*128 + ((ch ^ w)*16) + 4*t
            for j in range(N//8):
                for q in range(KT//64):
                    n = w + 8*j; off = 4*lane + 128*q
                    yield n, off//4, d + q*N*128 + 1024*j
        elif MAP == 2:
            c, t, nl = tid&3, (tid>>2)&3, tid>>4
            d = (c>>1)*STEP + (c&1)*128 + (nl//8)*256 + (nl%8)*16 + 4*t
            for j in range(N//16):
                for bb in range(KT//32):
                    n = nl + 16*j; off = 16*t + 4*c + 64*bb
                    yield n, off//4, d + 2*bb*STEP + 512*j
        else:
            t, nl = tid&3, tid>>2
            d = (nl//8)*256 + (nl%8)*16 + 4*t
            for j in range(N//64):
                for bb in range(KT//32):
                    for c in range(4):
                        n = nl + 64*j; off = 16*t + 64*bb + 4*c
                        yield n, off//4, d + 2048*j + (2*bb + (c>>1))*STEP + (c&1)*128
def check(MAP, N, KT):
    mem = {}
    for n, w, dst in run(MAP, N, KT):
        assert dst % 4 == 0
        k0, k1 = src_word_cols(w)
        for i, k in enumerate((k0, k1)):
            a = dst + 2*i
            assert a not in mem, (MAP, a)
            mem[a] = (n, k)
    assert len(mem) == N*KT, len(mem)
    # what wgmma reads: step s, column n, k in 0..15
    for s in range(KT//16):
        for n in range(N):
            for k in range(16):
                if MAP == 3:
                    start = (s//4)*N*128 + (s%4)*32
                    logical = start + (n//8)*1024 + (n%8)*128 + (k//8)*16 + (k%8)*2
                    phys = logical ^ (((logical >> 7) & 7) << 4)
                else:
                    phys = s*N*32 + (n//8)*256 + (k//8)*128 + (n%8)*16 + (k%8)*2
                assert mem[phys] == (n, 16*s + k), (MAP, s, n, k, mem[phys])
for MAP in (1, 2, 3):
    for N, KT in ((64, 64), (128, 64), (64, 256), (128, 256)):
        check(MAP, N, KT)
print("all maps place (n, k) where the descriptor reads it")
from collections import defaultdict
for MAP in (1, 2, 3):
    for N, KT in ((128, 64), (64, 256)):
        per = defaultdict(list)   # (warp, instruction index) -> [(dst, n, w)]
        # run() yields each thread's copies in the kernel's (unrolled) instruction order
        items = list(run(MAP, N, KT)); nper = len(items)//256
        worst = 0; lines = 0
        for wp in range(8):
            for i in range(nper):
                acc = [items[(wp*32+l)*nper + i] for l in range(32)]
                banks = defaultdict(set)
                for n, w, dst in acc: banks[(dst//4) % 32].add(dst//4)
                worst = max(worst, max(len(v) for v in banks.values()))
                lines = max(lines, len({n for n, w, dst in acc}))
        print(f"MAP {MAP} N={N} KT={KT}: copies/thread {nper}, worst bank conflict {worst}-way, token rows per warp copy {lines}")
