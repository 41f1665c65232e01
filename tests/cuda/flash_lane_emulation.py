#!/usr/bin/env python3
# Lane-level emulation of the FlashAttention kernels' index math, for machines without a GPU (plain Python, no
# numpy; about 10 s). ldmatrix (plain and .trans) and mma.m16n8k16 are modelled from the PTX ISA's fragment
# tables (flash_kernel.cuh quotes them), independently of the kernels; the kernel code (lane addresses, C->A
# register reuse, masks, online softmax, causal tile ranges, double-buffer-free tile order, stores) is mirrored
# line by line from flash_kernel.cuh, flash_forward.cu, flash_backward_dq.cu and flash_backward_dkdv.cu. Exact
# f64 arithmetic, so any indexing or masking error shows as an O(1) difference from direct attention, and an
# element never written shows as None. Usage: flash_lane_emulation.py [T Dh kD causal kQ]. Keep it in step with
# the kernels when their indexing changes; the GPU tests (test_flash_attention.cpp) remain the real check.
import math, random, sys

def ldmatrix(tile, addr, trans):
    # addr(lane) -> (row, col) of the row start for lane; returns regs[lane][j] = (lo, hi)
    out = [[None]*4 for _ in range(32)]
    for j in range(4):
        rows = [addr(8*j + r) for r in range(8)]
        M = [[tile[rows[r][0]][rows[r][1] + c] for c in range(8)] for r in range(8)]
        for l in range(32):
            if not trans: out[l][j] = (M[l//4][2*(l%4)], M[l//4][2*(l%4)+1])
            else: out[l][j] = (M[2*(l%4)][l//4], M[2*(l%4)+1][l//4])
    return out

def mma(acc, a, b0, b1):
    # acc[lane] = [c0..c3]; a[lane] = 4 pairs; b0[lane], b1[lane] pairs
    A = [[0.0]*16 for _ in range(16)]; B = [[0.0]*8 for _ in range(16)]
    for l in range(32):
        g, c = l//4, 2*(l%4)
        for i in range(2):
            A[g][c+i] = a[l][0][i]; A[g+8][c+i] = a[l][1][i]; A[g][c+8+i] = a[l][2][i]; A[g+8][c+8+i] = a[l][3][i]
            B[c+i][g] = b0[l][i]; B[c+8+i][g] = b1[l][i]
    for l in range(32):
        g, c = l//4, 2*(l%4)
        for e in range(4):
            r = g + 8*(e >> 1); col = c + (e & 1)
            acc[l][e] += sum(A[r][k]*B[k][col] for k in range(16))

def warp_gemm_nt(acc, sA, a_row0, sB, b_row0, kN8, kK):
    for kk in range(0, kK, 16):
        a = ldmatrix(sA, lambda l: (a_row0 + (l & 15), kk + (l >> 4)*8), False)
        for n in range(0, kN8, 2):
            b = ldmatrix(sB, lambda l: (b_row0 + n*8 + (l & 7) + ((l >> 4) << 3), kk + ((l >> 3) & 1)*8), False)
            mma(acc[n], a, [b[l][0] for l in range(32)], [b[l][1] for l in range(32)])
            mma(acc[n+1], a, [b[l][2] for l in range(32)], [b[l][3] for l in range(32)])

def warp_gemm_rn(acc, afr, sB, kN8, kK):
    for kk in range(kK//16):
        for n in range(0, kN8, 2):
            b = ldmatrix(sB, lambda l: (kk*16 + (l & 7) + (((l >> 3) & 1) << 3), n*8 + (l >> 4)*8), True)
            mma(acc[n], afr[kk], [b[l][0] for l in range(32)], [b[l][1] for l in range(32)])
            mma(acc[n+1], afr[kk], [b[l][2] for l in range(32)], [b[l][3] for l in range(32)])

def c_to_a(c, kN8):
    return [[[(c[2*kk][l][0], c[2*kk][l][1]), (c[2*kk][l][2], c[2*kk][l][3]),
              (c[2*kk+1][l][0], c[2*kk+1][l][1]), (c[2*kk+1][l][2], c[2*kk+1][l][3])] for l in range(32)]
            for kk in range(kN8//2)]

def zeros(n8): return [[[0.0]*4 for _ in range(32)] for _ in range(n8)]

def load_tile(src_rows, r0, rows, kRows, kD, Dh):
    # src_rows(t) -> list of Dh values of global row t; rows valid from r0
    return [[(src_rows(r0 + r)[c] if (r < rows and c < Dh) else 0.0) for c in range(kD + 8)] for r in range(kRows)]

def forward(Q, K, V, T, Dh, kD, causal):
    scale_log2 = 1/math.sqrt(Dh) * math.log2(math.e)
    O = [[None]*Dh for _ in range(T)]; LSE = [None]*T
    nq = (T + 63)//64
    for q_tile in range(nq):
        q0 = q_tile*64
        sQ = load_tile(lambda t: Q[t], q0, T - q0, 64, kD, Dh)
        n_all = nq; n_kt = min(q_tile+1, n_all) if causal else n_all
        for warp in range(4):
            o = zeros(kD//8); m = [[-math.inf]*2 for _ in range(32)]; lsum = [[0.0]*2 for _ in range(32)]
            for j in range(n_kt):
                k0 = j*64
                sK = load_tile(lambda t: K[t], k0, T - k0, 64, kD, Dh); sV = load_tile(lambda t: V[t], k0, T - k0, 64, kD, Dh)
                s = zeros(8); warp_gemm_nt(s, sQ, warp*16, sK, 0, 8, kD)
                edge = k0 + 64 > T or (causal and k0 + 63 > q0)
                for l in range(32):
                    row_a = q0 + warp*16 + (l >> 2)
                    for n in range(8):
                        for e in range(4):
                            key = k0 + n*8 + 2*(l & 3) + (e & 1); row = row_a + (e >> 1)*8
                            masked = edge and (key >= T or (causal and key > row))
                            s[n][l][e] = -math.inf if masked else s[n][l][e]*scale_log2
                for half in range(2):
                    mx = [max([m[l][half]] + [max(s[n][l][2*half], s[n][l][2*half+1]) for n in range(8)]) for l in range(32)]
                    mx = [max(mx[l], mx[l ^ 1]) for l in range(32)]; mx = [max(mx[l], mx[l ^ 2]) for l in range(32)]
                    for l in range(32):
                        shift = 0.0 if mx[l] == -math.inf else mx[l]
                        alpha = 2**(m[l][half] - shift) if m[l][half] != -math.inf else 0.0
                        sm = 0.0
                        for n in range(8):
                            for e in (2*half, 2*half+1):
                                s[n][l][e] = 2**(s[n][l][e] - shift) if s[n][l][e] != -math.inf else 0.0; sm += s[n][l][e]
                        lsum[l][half] = lsum[l][half]*alpha + sm; m[l][half] = mx[l]
                        for n in range(kD//8):
                            o[n][l][2*half] *= alpha; o[n][l][2*half+1] *= alpha
                pa = c_to_a(s, 8); warp_gemm_rn(o, pa, sV, kD//8, 64)
            for half in range(2):
                ls = [lsum[l][half] for l in range(32)]; ls = [ls[l] + ls[l ^ 1] for l in range(32)]; ls = [ls[l] + ls[l ^ 2] for l in range(32)]
                for l in range(32):
                    r = q0 + warp*16 + (l >> 2) + 8*half
                    if r >= T: continue
                    for n in range(kD//8):
                        col = n*8 + 2*(l & 3)
                        if col < Dh:
                            assert O[r][col] is None
                            O[r][col] = o[n][l][2*half]/ls[l]; O[r][col+1] = o[n][l][2*half+1]/ls[l]
                    if (l & 3) == 0: LSE[r] = (m[l][half] + math.log2(ls[l]))*math.log(2)
    return O, LSE

def backward(Q, K, V, dO, LSE, Dv, T, Dh, kD, causal, kQ):
    scale = 1/math.sqrt(Dh); scale_log2 = scale*math.log2(math.e)
    dQ = [[None]*Dh for _ in range(T)]; dK = [[None]*Dh for _ in range(T)]; dV = [[None]*Dh for _ in range(T)]
    nq = (T + 63)//64
    # dQ pass
    for q_tile in range(nq):
        q0 = q_tile*64
        sQ = load_tile(lambda t: Q[t], q0, T - q0, 64, kD, Dh); sdO = load_tile(lambda t: dO[t], q0, T - q0, 64, kD, Dh)
        n_kt = min(q_tile+1, nq) if causal else nq
        for warp in range(4):
            dq = zeros(kD//8)
            for j in range(n_kt):
                k0 = j*64
                sK = load_tile(lambda t: K[t], k0, T - k0, 64, kD, Dh); sV = load_tile(lambda t: V[t], k0, T - k0, 64, kD, Dh)
                s = zeros(8); dp = zeros(8)
                warp_gemm_nt(s, sQ, warp*16, sK, 0, 8, kD); warp_gemm_nt(dp, sdO, warp*16, sV, 0, 8, kD)
                edge = k0 + 64 > T or (causal and k0 + 63 > q0)
                for l in range(32):
                    row_a = q0 + warp*16 + (l >> 2)
                    for n in range(8):
                        for e in range(4):
                            key = k0 + n*8 + 2*(l & 3) + (e & 1); half = e >> 1; row = row_a + 8*half
                            lse2 = LSE[row]*math.log2(math.e) if row < T else 0.0; Dr = Dv[row] if row < T else 0.0
                            masked = edge and (key >= T or (causal and key > row))
                            pv = 0.0 if masked else 2**(s[n][l][e]*scale_log2 - lse2)
                            s[n][l][e] = pv*(dp[n][l][e] - Dr)
                warp_gemm_rn(dq, c_to_a(s, 8), sK, kD//8, 64)
            for l in range(32):
                for half in range(2):
                    r = q0 + warp*16 + (l >> 2) + 8*half
                    if r >= T: continue
                    for n in range(kD//8):
                        col = n*8 + 2*(l & 3)
                        if col < Dh: dQ[r][col] = dq[n][l][2*half]*scale; dQ[r][col+1] = dq[n][l][2*half+1]*scale
    # dK dV pass
    n_qt = (T + kQ - 1)//kQ
    for kt in range(nq):
        k0 = kt*64
        sK = load_tile(lambda t: K[t], k0, T - k0, 64, kD, Dh); sV = load_tile(lambda t: V[t], k0, T - k0, 64, kD, Dh)
        i_begin = k0//kQ if causal else 0
        for warp in range(4):
            dk = zeros(kD//8); dv = zeros(kD//8)
            for i in range(i_begin, n_qt):
                q0 = i*kQ
                sQ = load_tile(lambda t: Q[t], q0, T - q0, kQ, kD, Dh); sdO = load_tile(lambda t: dO[t], q0, T - q0, kQ, kD, Dh)
                sL = [LSE[q0+t]*math.log2(math.e) if q0+t < T else math.inf for t in range(kQ)]
                sD = [Dv[q0+t] if q0+t < T else 0.0 for t in range(kQ)]
                st = zeros(kQ//8); dpt = zeros(kQ//8)
                warp_gemm_nt(st, sK, warp*16, sQ, 0, kQ//8, kD); warp_gemm_nt(dpt, sV, warp*16, sdO, 0, kQ//8, kD)
                edge = q0 + kQ > T or k0 + 64 > T or (causal and q0 < k0 + 63)
                for l in range(32):
                    key_a = k0 + warp*16 + (l >> 2)
                    for n in range(kQ//8):
                        for e in range(4):
                            ql = n*8 + 2*(l & 3) + (e & 1); q = q0 + ql; key = key_a + (e >> 1)*8
                            masked = edge and (q >= T or key >= T or (causal and key > q))
                            pv = 0.0 if masked else 2**(st[n][l][e]*scale_log2 - sL[ql])
                            st[n][l][e] = pv; dpt[n][l][e] = pv*(dpt[n][l][e] - sD[ql])
                warp_gemm_rn(dv, c_to_a(st, kQ//8), sdO, kD//8, kQ); warp_gemm_rn(dk, c_to_a(dpt, kQ//8), sQ, kD//8, kQ)
            for l in range(32):
                for half in range(2):
                    r = k0 + warp*16 + (l >> 2) + 8*half
                    if r >= T: continue
                    for n in range(kD//8):
                        col = n*8 + 2*(l & 3)
                        if col < Dh:
                            dK[r][col] = dk[n][l][2*half]*scale; dK[r][col+1] = dk[n][l][2*half+1]*scale
                            dV[r][col] = dv[n][l][2*half]; dV[r][col+1] = dv[n][l][2*half+1]
    return dQ, dK, dV

def reference(Q, K, V, dO, T, Dh, causal):
    sc = 1/math.sqrt(Dh)
    P = []; LSE = []; O = []
    for i in range(T):
        s = [sum(Q[i][d]*K[j][d] for d in range(Dh))*sc if (not causal or j <= i) else -math.inf for j in range(T)]
        mx = max(s); z = sum(math.exp(x - mx) for x in s); lse = mx + math.log(z)
        p = [math.exp(x - lse) for x in s]; P.append(p); LSE.append(lse)
        O.append([sum(p[j]*V[j][d] for j in range(T)) for d in range(Dh)])
    Dv = [sum(dO[i][d]*O[i][d] for d in range(Dh)) for i in range(T)]
    dP = [[sum(dO[i][d]*V[j][d] for d in range(Dh)) for j in range(T)] for i in range(T)]
    dS = [[P[i][j]*(dP[i][j] - Dv[i]) for j in range(T)] for i in range(T)]
    dQ = [[sc*sum(dS[i][j]*K[j][d] for j in range(T)) for d in range(Dh)] for i in range(T)]
    dK = [[sc*sum(dS[i][j]*Q[i][d] for i in range(T)) for d in range(Dh)] for j in range(T)]
    dV = [[sum(P[i][j]*dO[i][d] for i in range(T)) for d in range(Dh)] for j in range(T)]
    return O, LSE, Dv, dQ, dK, dV

def maxdiff(a, b):
    return max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb))

if __name__ == "__main__":
    random.seed(1)
    for (T, Dh, kD, causal, kQ) in [(int(a) for a in sys.argv[1:6])] if len(sys.argv) > 5 else [(70, 16, 32, 1, 64), (70, 80, 80, 0, 64), (131, 32, 32, 1, 32), (1, 32, 32, 1, 64), (65, 24, 32, 0, 32)]:
        causal = bool(causal)
        Q = [[random.gauss(0, 1.5) for _ in range(Dh)] for _ in range(T)]
        K = [[random.gauss(0, 1.5) for _ in range(Dh)] for _ in range(T)]
        V = [[random.gauss(0, 1) for _ in range(Dh)] for _ in range(T)]
        dO = [[random.gauss(0, 1) for _ in range(Dh)] for _ in range(T)]
        O_r, L_r, D_r, dQ_r, dK_r, dV_r = reference(Q, K, V, dO, T, Dh, causal)
        O, L = forward(Q, K, V, T, Dh, kD, causal)
        assert all(x is not None for r in O for x in r) and all(x is not None for x in L), "unwritten"
        dQ, dK, dV = backward(Q, K, V, dO, L, D_r, T, Dh, kD, causal, kQ)
        assert all(x is not None for M in (dQ, dK, dV) for r in M for x in r), "unwritten grad"
        print(f"T={T} Dh={Dh} kD={kD} causal={causal} kQ={kQ}: O {maxdiff(O, O_r):.2e} lse {max(abs(a-b) for a,b in zip(L, L_r)):.2e} "
              f"dQ {maxdiff(dQ, dQ_r):.2e} dK {maxdiff(dK, dK_r):.2e} dV {maxdiff(dV, dV_r):.2e}", flush=True)
