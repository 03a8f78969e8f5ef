# One layer of the default model's attention (9 heads over 3 KV heads, 512 queries, 1,536 keys,
# float32) and its parts, on one core:
#   LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 OPENBLAS_NUM_THREADS=1 taskset -c 1 python probe_attention.py
import time, mlx.core as mx
B,H,KV,L,S,D=1,9,3,512,1536,64
q=mx.random.normal((B,H,L,D)); k=mx.random.normal((B,KV,S,D)); v=mx.random.normal((B,KV,S,D)); mx.eval(q,k,v)
def t(f, n=5):
    mx.eval(f()); ts=[]
    for _ in range(n):
        t0=time.perf_counter(); mx.eval(f()); ts.append(time.perf_counter()-t0)
    return min(ts)*1e3
sc=D**-0.5
def fused(): return mx.fast.scaled_dot_product_attention(q,k,v,scale=sc,mask="causal")
def fused_nomask(): return mx.fast.scaled_dot_product_attention(q,k,v,scale=sc)
def manual():
    qq=(q*sc).reshape(B,KV,H//KV,L,D)
    s=qq @ mx.swapaxes(k,-1,-2)[:,:,None]
    m=(mx.arange(L)[:,None]+(S-L)) >= mx.arange(S)[None]
    s=mx.where(m,s,-mx.inf)
    p=mx.softmax(s,axis=-1)
    return (p@v[:,:,None]).reshape(B,H,L,D)
def manual_flat():  # queries of a group stacked: one (3*512, 64) x (64, S) matmul per kv head
    qq=(q*sc).reshape(B,KV,(H//KV)*L,D)
    s=qq @ mx.swapaxes(k,-1,-2)
    s=s.reshape(B,KV,H//KV,L,S)
    m=(mx.arange(L)[:,None]+(S-L)) >= mx.arange(S)[None]
    s=mx.where(m,s,-mx.inf)
    p=mx.softmax(s,axis=-1).reshape(B,KV,(H//KV)*L,S)
    return (p@v).reshape(B,H,L,D)
def matmul_only():
    return (q.reshape(B,KV,3*L,D) @ mx.swapaxes(k,-1,-2))
print("fused causal %.1f ms, fused no mask %.1f, manual %.1f, manual flat %.1f, QK matmul only %.1f" % (t(fused), t(fused_nomask), t(manual), t(manual_flat), t(matmul_only)))
a=fused(); b=manual_flat(); print("max diff", mx.abs(a-b).max().item())
s=(q.reshape(B,KV,3*L,D) @ mx.swapaxes(k,-1,-2)); mx.eval(s)
p=mx.softmax(s,axis=-1); mx.eval(p)
print("softmax %.1f, softmax precise %.1f, exp %.1f, max-reduce %.1f, where %.1f, AV %.1f" % (
  t(lambda: mx.softmax(s,axis=-1)), t(lambda: mx.softmax(s,axis=-1,precise=True)), t(lambda: mx.exp(s)), t(lambda: s.max(-1)),
  t(lambda: mx.where(s>0,s,-mx.inf)), t(lambda: p@v)))
