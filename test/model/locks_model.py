#!/usr/bin/env python3
"""Exhaustive explicit-state model of redpacket's lock protocol over
PostgreSQL's heavyweight lock manager (advisory locks, two modes).

    python3 test/model/locks_model.py              new protocol, every config
    python3 test/model/locks_model.py --old        old protocol: must break
    python3 test/model/locks_model.py --queued     single claims that queue
                                                   holding A and U: must break
    python3 test/model/locks_model.py --config X   one configuration
    python3 test/model/locks_model.py --list       the configuration names
    python3 test/model/locks_model.py --selftest   broken programs are caught
    --strict-cycles  also count soft cycles (resolved by reordering a wait
                     queue) that include a single call as P1 failures

See README.md next to this file.  Standard library only.
"""
import itertools
import sys
import time
from collections import deque

NOHOLD = True            # --queued sets False: 1.4's single claim, queued
STRICT = False           # --strict-cycles: resolved soft cycles count for P1
S, X = 'S', 'X'          # RowExclusiveLock, ExclusiveLock


def conflict(m1, m2):
    return m1 == X or m2 == X


MULTI = {'twoclaim', 'recon_caller'}                 # multi-call transactions
WALKER = {'close', 'freeze', 'livechange', 'unfreeze', 'reconcile_strict',
          'reconciler_wait', 'reversal'}
TRYWALKER = {'reconciler_pass', 'pending_advance'}
SINGLE_CLAIM = {'claim', 'gclaim', 'batch'}
CLAIM_KINDS = SINGLE_CLAIM


# ---------------------------------------------------------------- programs
#
# A program is a list of instructions; ('L', name) is a label.
#   ('wait', obj, mode, p5)     acquire, sleeping if need be
#   ('waitnow', obj, mode)      acquire; must be granted at once (P6)
#   ('try', obj, mode, label)   conditional acquire; jump to label if refused
#   ('tryfree', obj, mode)      acquire; must be free (P6); waits otherwise
#   ('rel', obj, mode)          release one lock
#   ('relact', act)             release every lock of the activity
#   ('goto', label) ('choose', [labels]) ('idle', what) ('commit',)
#   ('leave',)  end without releasing (only in the --selftest mutants)
# Objects are names: A<a> G<a> U<u>.<a> S<s>.<a> R ; the activity is <a>.

class Acts:
    def __init__(self, nact, stripes):
        self.nact = nact
        self.stripes = stripes            # stripes per activity (dict)

    def sfx(self, a):
        return '' if self.nact == 1 else str(a)

    def A(self, a):
        return 'A' + self.sfx(a)

    def G(self, a):
        return 'G' + self.sfx(a)

    def U(self, u, a):
        return 'U%d%s' % (u, '' if self.nact == 1 else '.' + str(a))

    def S(self, s, a):
        return 'S%d%s' % (s, '' if self.nact == 1 else '.' + str(a))

    def allS(self, a):
        return [self.S(s, a) for s in range(self.stripes[a])]


class Asm:
    def __init__(self):
        self.code = []
        self.n = 0

    def lab(self, hint):
        self.n += 1
        return '%s%d' % (hint, self.n)

    def __call__(self, *ins):
        self.code.append(ins)

    def extend(self, lst):
        self.code.extend(lst)


def give_back_wait(k, U, Ss, again, got, busy):
    """The old claim's wait for a busy stripe: give the user lock back, wait
    for the stripe, take the user lock only if free, else start over."""
    k('rel', U, X)
    k('wait', Ss, X, False)
    k('try', U, X, busy)
    k('goto', got, 'write')
    k('L', busy)
    k('rel', Ss, X)
    k('goto', again, 'retry')


def claim_body(k, o, a, user, stripe, old):
    """Single claim 1., up to the write (no commit)."""
    U, Ss = o.U(user, a), o.S(stripe, a)
    if not old and NOHOLD:
        start, bu, bs, got = k.lab('s'), k.lab('b'), k.lab('b'), k.lab('g')
        k('L', start)
        k('wait', o.A(a), S, False)
        k('try', U, X, bu)
        k('try', Ss, X, bs)
        k('goto', got, 'write')
        k('L', bu)
        k('rel', o.A(a), S)
        k('waitend', U, X)
        k('goto', start, 'retry')
        k('L', bs)
        k('rel', U, X)
        k('rel', o.A(a), S)
        k('waitend', Ss, X)
        k('goto', start, 'retry')
        k('L', got)
        return
    if not old:
        busy, got = k.lab('b'), k.lab('g')
        k('wait', o.A(a), S, False)
        k('wait', U, X, False)
        k('try', Ss, X, busy)
        k('goto', got, 'write')
        k('L', busy)
        k('wait', Ss, X, False)
        k('L', got)
        return
    lu, busy, busy2, got = k.lab('u'), k.lab('b'), k.lab('b'), k.lab('g')
    k('L', lu)
    k('wait', U, X, False)
    k('try', Ss, X, busy)
    k('goto', got, 'write')
    k('L', busy)
    give_back_wait(k, U, Ss, lu, got, busy2)
    k('L', got)


def wait_in_order(k, objs, p5=False):
    for ob in objs:
        k('wait', ob, X, p5)


def wait_end(k, ob, old, m=X):
    """An earlier call's wait: in the lock's queue, holding what it kept."""
    k('wait', ob, m, False)


def wait_end_in_order(k, objs, old):
    for ob in objs:
        wait_end(k, ob, old)


def gather_after_A_X(k, o, a, extra, writes):
    """After A X: take everything free, decide, downgrade (2., 4.)."""
    for ob in extra:
        k('tryfree', ob, X)
    for ob in o.allS(a):
        k('tryfree', ob, X)
    k('idle', 'decide')
    k('waitnow', o.A(a), S)
    k('rel', o.A(a), X)
    for s in range(o.stripes[a]):
        if s not in writes:
            k('rel', o.S(s, a), X)


def prog_claim(o, old, a=0, user=0, stripe=0, needs=None, writes=(0,)):
    """A single claim; needs: the options it may find it needs after
    reading the activity with its user lock (a stripe number or 'all'),
    chosen anew on every attempt."""
    if needs is None:
        needs = (stripe,)
    k = Asm()
    U = o.U(user, a)
    nohold = NOHOLD and not old
    lu, got = k.lab('u'), k.lab('g')
    if nohold:
        bu = k.lab('b')
        k('L', lu)
        k('wait', o.A(a), S, False)
        k('try', U, X, bu)
    else:
        if not old:
            k('wait', o.A(a), S, False)
        k('L', lu)
        k('wait', U, X, False)
    labs = [k.lab('n') for _ in needs]
    if len(needs) > 1:
        k('choose', labs, ['needs ' + ('every stripe' if n == 'all' else
                                       o.S(n, a)) for n in needs])
    for lab, need in zip(labs, needs):
        k('L', lab)
        if need == 'all':
            if old:
                wait_in_order(k, o.allS(a), True)
                k('idle', 'decide')
            else:
                k('rel', U, X)
                k('rel', o.A(a), S)
                k('wait', o.A(a), X, True)
                gather_after_A_X(k, o, a, [U], writes)
            k('goto', got, 'write')
            continue
        Ss = o.S(need, a)
        busy, busy2 = k.lab('b'), k.lab('b')
        k('try', Ss, X, busy)
        k('goto', got, 'write')
        k('L', busy)
        if nohold:
            k('rel', U, X)
            k('rel', o.A(a), S)
            k('waitend', Ss, X)
            k('goto', lu, 'retry')
            continue
        if not old:
            k('wait', Ss, X, False)
            k('goto', got, 'write')
            continue
        give_back_wait(k, U, Ss, lu, got, busy2)
    if nohold:
        k('L', bu)
        k('rel', o.A(a), S)
        k('waitend', U, X)
        k('goto', lu, 'retry')
    k('L', got)
    k('commit',)
    return k.code


def prog_gclaim(o, old, a=0, user=0, writes=(0,)):
    k = Asm()
    U = o.U(user, a)
    if old:
        k('wait', U, X, False)
        wait_in_order(k, o.allS(a), True)
        k('idle', 'decide')
        k('commit',)
        return k.code
    k('wait', o.A(a), S, False)
    k('wait', U, X, False)
    k('rel', U, X)
    k('rel', o.A(a), S)
    k('wait', o.A(a), X, True)
    gather_after_A_X(k, o, a, [U], writes)
    k('commit',)
    return k.code


def prog_twoclaim(o, old, a=0, user=1, stripe=1, second=((1, 0),), idle=1,
                  a2=None):
    """second: options (user, stripe or 'all') for the second call, on
    activity a2 (default a)."""
    k = Asm()
    claim_body(k, o, a, user, stripe, old)
    for _ in range(idle):
        k('idle', 'between calls')
    b = a if a2 is None else a2
    labs = [k.lab('c') for _ in second]
    end = k.lab('e')
    k('choose', labs, ['second call: %s, needs %s' % (
        o.U(u2, b), 'every stripe' if n == 'all' else o.S(n, b))
        for u2, n in second])
    for lab, (u2, need) in zip(labs, second):
        k('L', lab)
        if b != a and need != 'all' and NOHOLD and not old:
            claim_body(k, o, b, u2, need, old)  # a first call on b
            k('goto', end, 'done')
            continue
        if not old:
            k('wait', o.A(b), S, False)        # a re-acquire when b == a
        if b == a:
            wait_end(k, o.U(u2, b), old)
            if need == 'all':
                wait_end_in_order(k, o.allS(b), old)
            else:
                wait_end(k, o.S(need, b), old)
        else:
            k('wait', o.U(u2, b), X, False)
            if need == 'all':
                wait_in_order(k, o.allS(b))
            else:
                w, c = k.lab('w'), k.lab('c')
                k('try', o.S(need, b), X, w)
                k('goto', c, 'write')
                k('L', w)
                k('wait', o.S(need, b), X, False)
                k('L', c)
        k('goto', end, 'done')
    k('L', end)
    k('commit',)
    return k.code


def prog_batch(o, old, a=0, users=(0, 1), need=0, writes=(0,)):
    k = Asm()
    if not old:
        k('wait', o.A(a), S, False)
    k('wait', o.G(a), X, False)
    for u in users:
        k('wait', o.U(u, a), X, False)
    done = k.lab('d')
    if need == 'all':
        g = k.lab('g')
        for ob in o.allS(a):
            k('try', ob, X, g)
        k('goto', done, 'write')
        k('L', g)
        if old:
            wait_in_order(k, o.allS(a), True)
        else:
            k('relact', a)
            k('wait', o.A(a), X, True)
            gather_after_A_X(k, o, a, [o.G(a)] + [o.U(u, a) for u in users],
                             writes)
    else:
        w = k.lab('w')
        k('try', o.S(need, a), X, w)
        k('goto', done, 'write')
        k('L', w)
        k('wait', o.S(need, a), X, False)
    k('L', done)
    k('commit',)
    return k.code


def walker_body(k, o, a, old):
    if old:
        wait_in_order(k, o.allS(a), True)
    else:
        k('wait', o.A(a), X, True)
        for ob in o.allS(a):
            k('tryfree', ob, X)
    k('idle', 'write')


def prog_walker(o, old, a=0):
    k = Asm()
    walker_body(k, o, a, old)
    k('commit',)
    return k.code


def prog_reversal(o, old, a=0):
    k = Asm()
    k('wait', 'R', X, False)
    walker_body(k, o, a, old)
    k('commit',)
    return k.code


def prog_trywalker(o, old, a=0):
    k = Asm()
    end = k.lab('e')
    if old:
        for ob in o.allS(a):
            k('try', ob, X, end)
    else:
        k('try', o.A(a), X, end)
        for ob in o.allS(a):
            k('tryfree', ob, X)
    k('idle', 'work')
    k('L', end)
    k('relact', a)
    k('commit',)
    return k.code


def prog_recon_caller(o, old, a=0, user=0, stripe=0, a2=1):
    k = Asm()
    claim_body(k, o, a, user, stripe, old)
    k('idle', 'reconcile pass')
    wait_end_in_order(k, o.allS(a), old)      # activity held earlier
    if old:
        wait_in_order(k, o.allS(a2))
    else:
        k('wait', o.A(a2), X, False)
        for ob in o.allS(a2):
            k('tryfree', ob, X)
    k('commit',)
    return k.code


def prog_wallet(o, old):
    k = Asm()
    k('wait', 'R', X, False)
    k('idle', 'idle')
    k('idle', 'idle')
    k('commit',)
    return k.code


BUILDERS = {
    'claim': prog_claim, 'gclaim': prog_gclaim, 'twoclaim': prog_twoclaim,
    'batch': prog_batch, 'reversal': prog_reversal, 'wallet': prog_wallet,
    'recon_caller': prog_recon_caller,
}
for _k in WALKER - {'reversal'}:
    BUILDERS[_k] = prog_walker
for _k in TRYWALKER:
    BUILDERS[_k] = prog_trywalker


def assemble(code):
    labels, out = {}, []
    for ins in code:
        if ins[0] == 'L':
            labels[ins[1]] = len(out)
        else:
            out.append(ins)
    res = []
    for ins in out:
        if ins[0] == 'try':
            ins = ins[:3] + (labels[ins[3]],)
        elif ins[0] == 'goto':
            ins = ('goto', labels[ins[1]], ins[2] if len(ins) > 2 else '')
        elif ins[0] == 'choose':
            ins = ('choose', tuple(labels[x] for x in ins[1]), tuple(ins[2]))
        res.append(ins)
    return res


# ------------------------------------------------------------------ configs
#
# Each: name, number of activities, stripes per activity, actors as
# (name, kind, builder kwargs, lock_timeout).

CONFIGS = [
    ('twoclaim_walker', 1, {0: 2}, [
        ('T', 'twoclaim', dict(user=1, stripe=1, second=(
            (1, 0), (1, 1), (0, 0), (0, 'all'))), False),
        ('close', 'close', {}, False)]),
    ('twoclaim_walker_claim', 1, {0: 2}, [
        ('T', 'twoclaim', dict(user=1, stripe=1, second=(
            (1, 0), (0, 0), (0, 'all'))), False),
        ('close', 'close', {}, False),
        ('C', 'claim', dict(user=0, needs=(0, 1, 'all')), False)]),
    ('twoclaim_gatherer_claim', 1, {0: 2}, [
        ('T', 'twoclaim', dict(user=1, stripe=1,
                               second=((1, 0), (0, 0), (1, 'all'))), False),
        ('G', 'gclaim', dict(user=0, writes=(1,)), False),
        ('C', 'claim', dict(user=0, needs=(0, 1)), False)]),
    ('bystander_between_holders', 1, {0: 2}, [
        ('T1', 'twoclaim', dict(user=1, stripe=1, second=((1, 0),)), False),
        ('T2', 'twoclaim', dict(user=0, stripe=0, second=((0, 1),)), False),
        ('C', 'claim', dict(user=2, needs=(0, 1)), False)]),
    ('bystander_in_user_queue', 1, {0: 2}, [
        ('T1', 'twoclaim', dict(user=1, stripe=1, second=((1, 0),)), False),
        ('T2', 'twoclaim', dict(user=0, stripe=0, second=((1, 1),)), False),
        ('C', 'claim', dict(user=1, needs=(0, 1)), False)]),
    ('bystander_two_activities', 2, {0: 1, 1: 1}, [
        ('T1', 'twoclaim', dict(a=0, user=0, stripe=0, a2=1,
                                second=((0, 0),)), False),
        ('T2', 'twoclaim', dict(a=1, user=0, stripe=0, a2=0,
                                second=((2, 0),)), False),
        ('C', 'claim', dict(a=0, user=1, needs=(0,)), False)]),
    ('two_twoclaims', 1, {0: 2}, [
        ('T1', 'twoclaim', dict(user=1, stripe=1, second=(
            (1, 0), (0, 0), (0, 'all'))), False),
        ('T2', 'twoclaim', dict(user=0, stripe=0, second=(
            (0, 1), (1, 1), (1, 'all'))), False)]),
    ('batch_twoclaim_walker', 1, {0: 2}, [
        ('B', 'batch', dict(users=(0, 1), need=1), False),
        ('T', 'twoclaim', dict(user=1, stripe=1, second=((1, 0), (0, 0))),
         False),
        ('freeze', 'freeze', {}, False)]),
    ('batch_twoclaim_walker_disjoint_users', 1, {0: 2}, [
        ('B', 'batch', dict(users=(0,), need=1), False),
        ('T', 'twoclaim', dict(user=1, stripe=1, second=(
            (1, 0), (1, 1), (1, 'all'))), False),
        ('freeze', 'freeze', {}, False)]),
    ('batch_gather_claim_livechange', 1, {0: 2}, [
        ('B', 'batch', dict(users=(0,), need='all', writes=(0,)), False),
        ('C', 'claim', dict(user=1, needs=(1, 'all'), writes=(1,)), False),
        ('live', 'livechange', {}, False)]),
    ('batch_gather_twoclaim', 1, {0: 2}, [
        ('B', 'batch', dict(users=(0,), need='all', writes=(1,)), False),
        ('T', 'twoclaim', dict(user=1, stripe=0, second=(
            (1, 1), (1, 'all'))), False),
        ('C', 'claim', dict(user=0, needs=(0,)), False)]),
    ('reversal_wallet_claim', 1, {0: 2}, [
        ('W', 'wallet', {}, False),
        ('rev', 'reversal', {}, False),
        ('C', 'claim', dict(user=0, needs=(0, 'all')), False)]),
    ('pending_advance_claims', 1, {0: 2}, [
        ('P', 'pending_advance', {}, False),
        ('C1', 'claim', dict(user=0, needs=(0, 'all')), False),
        ('C2', 'claim', dict(user=1, needs=(0, 1)), False)]),
    ('recon_caller_twoclaim_claim', 2, {0: 2, 1: 1}, [
        ('RC', 'recon_caller', dict(user=0, stripe=0, a2=1), False),
        ('T', 'twoclaim', dict(user=1, stripe=1, second=(
            (1, 0), (1, 'all'), (0, 0))), False),
        ('C', 'claim', dict(a=1, user=0, needs=(0, 'all')), False)]),
    ('walker_lock_timeout', 1, {0: 2}, [
        ('T', 'twoclaim', dict(user=1, stripe=1, second=((1, 0), (0, 'all')),
                               idle=2), False),
        ('unfreeze', 'unfreeze', {}, True),
        ('C', 'claim', dict(user=0, needs=(0, 'all')), False)]),
    ('strict_reconcile_pass_twoclaim', 1, {0: 2}, [
        ('strict', 'reconcile_strict', {}, False),
        ('pass', 'reconciler_pass', {}, False),
        ('T', 'twoclaim', dict(user=0, stripe=0, second=((0, 1), (1, 1))),
         False)]),
    ('reconciler_wait_gclaim_claim', 1, {0: 3}, [
        ('rw', 'reconciler_wait', {}, False),
        ('G', 'gclaim', dict(user=0, writes=(2,)), False),
        ('C', 'claim', dict(user=1, needs=(2, 0)), False)]),
    ('four_actors', 1, {0: 2}, [
        ('T', 'twoclaim', dict(user=1, stripe=1, second=((1, 0), (0, 'all'))),
         False),
        ('close', 'close', {}, False),
        ('C', 'claim', dict(user=0, needs=(0, 'all')), False),
        ('P', 'pending_advance', {}, False)]),
    ('soft_cycle_two_activities', 2, {0: 1, 1: 1}, [
        ('T1', 'twoclaim', dict(a=0, user=0, stripe=0, a2=1,
                                second=((1, 0),)), False),
        ('T2', 'twoclaim', dict(a=1, user=0, stripe=0, a2=0,
                                second=((1, 0),)), False),
        ('close', 'close', dict(a=0), False)]),
    ('big_twoclaim_close_gclaim_claim', 1, {0: 3}, [
        ('T', 'twoclaim', dict(user=1, stripe=1, second=(
            (1, 0), (0, 2), (1, 'all'))), False),
        ('close', 'close', {}, True),
        ('G', 'gclaim', dict(user=0, writes=(0,)), False),
        ('C', 'claim', dict(user=0, needs=(0, 2, 'all')), False)]),
    ('big_batch_twoclaims_freeze', 1, {0: 2}, [
        ('B', 'batch', dict(users=(0,), need='all', writes=(0,)), False),
        ('T1', 'twoclaim', dict(user=1, stripe=1, second=((1, 0), (1, 'all'))),
         False),
        ('T2', 'twoclaim', dict(user=1, stripe=0, second=((1, 1),)), False),
        ('freeze', 'freeze', {}, False)]),
    ('claims_retry', 1, {0: 1}, [
        ('C1', 'claim', dict(user=0, stripe=0), False),
        ('C2', 'claim', dict(user=0, stripe=0), False),
        ('C3', 'claim', dict(user=1, stripe=0), False)]),
]

# Broken programs, to show that each property can fail (--selftest).

def mut_gclaim_keeps_A(o, old, a=0, user=0):
    """A gatherer that waits for A X still holding A S."""
    k = Asm()
    k('wait', o.A(a), S, False)
    k('wait', o.U(user, a), X, False)
    k('rel', o.U(user, a), X)
    k('wait', o.A(a), X, True)
    gather_after_A_X(k, o, a, [o.U(user, a)], (0,))
    k('commit',)
    return k.code


def mut_claim_no_A(o, old, a=0, user=0, stripe=0):
    """A claim that takes its stripe without A."""
    k = Asm()
    k('wait', o.U(user, a), X, False)
    k('wait', o.S(stripe, a), X, False)
    k('idle', 'write')
    k('commit',)
    return k.code


def mut_trywalker_waits(o, old, a=0):
    k = Asm()
    k('wait', o.A(a), X, True)
    k('relact', a)
    k('commit',)
    return k.code


def mut_claim_reads_wallet(o, old, a=0, user=0, stripe=0):
    k = Asm()
    k('wait', o.A(a), S, False)
    k('wait', 'R', X, False)
    k('commit',)
    return k.code


def mut_claim_leaks_A(o, old, a=0, user=0, stripe=0):
    """A claim that ends without releasing A (a lost release)."""
    k = Asm()
    k('wait', o.A(a), S, False)
    k('leave',)
    return k.code


def mut_claim_gives_back(o, old, a=0, user=0, stripe=0):
    """A claim that gives its user lock back before waiting for a stripe
    and takes it only if free after: two claims of one user can swap the
    user and the stripe forever."""
    k = Asm()
    k('wait', o.A(a), S, False)
    claim_body(k, o, a, user, stripe, True)
    k('commit',)
    return k.code


BUILDERS.update(mut_claim_gives_back=mut_claim_gives_back)
BUILDERS.update(mut_gclaim_keeps_A=mut_gclaim_keeps_A,
                mut_claim_no_A=mut_claim_no_A,
                mut_trywalker_waits=mut_trywalker_waits,
                mut_claim_reads_wallet=mut_claim_reads_wallet,
                mut_claim_leaks_A=mut_claim_leaks_A)

SELFTESTS = [   # (expected failing property, configuration)
    ('P1', ('mut_two_gatherers_keep_A', 1, {0: 1}, [
        ('G1', 'gclaim', dict(_prog='mut_gclaim_keeps_A', user=0), False),
        ('G2', 'gclaim', dict(_prog='mut_gclaim_keeps_A', user=1), False)])),
    ('P5', ('mut_gatherer_keeps_A', 1, {0: 1}, [
        ('G', 'gclaim', dict(_prog='mut_gclaim_keeps_A', user=0), False),
        ('C', 'claim', dict(user=1), False)])),
    ('P6', ('mut_claim_without_A', 1, {0: 1}, [
        ('C', 'claim', dict(_prog='mut_claim_no_A'), False),
        ('close', 'close', {}, False)])),
    ('P4', ('mut_try_walker_waits', 1, {0: 1}, [
        ('P', 'pending_advance', dict(_prog='mut_trywalker_waits'), False),
        ('C', 'claim', {}, False)])),
    ('P7', ('mut_claim_reads_wallet_row', 1, {0: 1}, [
        ('W', 'wallet', {}, False),
        ('C', 'claim', dict(_prog='mut_claim_reads_wallet'), False)])),
    ('P2', ('mut_claim_leaks_A', 1, {0: 1}, [
        ('C', 'claim', dict(_prog='mut_claim_leaks_A'), False),
        ('close', 'close', {}, False)])),
    ('P2', ('mut_claims_give_back', 1, {0: 1}, [
        ('C1', 'claim', dict(_prog='mut_claim_gives_back', user=0), False),
        ('C2', 'claim', dict(_prog='mut_claim_gives_back', user=0), False),
        ('C3', 'claim', dict(user=1, stripe=0), False)])),
]


OLD_CONFIGS = [
    ('old_twoclaim_close', 1, {0: 2}, [
        ('T', 'twoclaim', dict(user=1, stripe=1, second=((1, 0),)), False),
        ('close', 'close', {}, False)]),
]


# ------------------------------------------------------------------ model

class Model:
    def __init__(self, cfg, old):
        name, nact, stripes, actors = cfg
        self.name, self.old = name, old
        o = Acts(nact, stripes)
        self.names = [a[0] for a in actors]
        self.kinds = [a[1] for a in actors]
        self.timeout = [a[3] for a in actors]
        self.progs = [assemble(BUILDERS[kw.get('_prog', kd)](
            o, old, **{k: v for k, v in kw.items() if k != '_prog'}))
            for (_, kd, kw, _) in actors]
        objs = set()
        for p in self.progs:
            for ins in p:
                if ins[0] in ('wait', 'waitnow', 'try', 'tryfree', 'rel', 'waitend'):
                    objs.add(ins[1])
        for a in range(nact):
            objs.add(o.A(a))
            objs.update(o.allS(a))
        self.objs = sorted(objs)
        self.oid = {n: i for i, n in enumerate(self.objs)}
        self.oact = [self.act_of(n, nact) for n in self.objs]
        self.actobj = {a: [i for i, x in enumerate(self.oact) if x == a]
                       for a in range(nact)}
        # resolve object names to ids
        for p in self.progs:
            for j, ins in enumerate(p):
                if ins[0] in ('wait', 'waitnow', 'try', 'tryfree', 'rel', 'waitend'):
                    p[j] = (ins[0], self.oid[ins[1]]) + ins[2:]
        self.n = len(actors)
        self.multi = [kd in MULTI for kd in self.kinds]
        self.dlcache = {}

    @staticmethod
    def act_of(n, nact):
        if n == 'R':
            return None
        if nact == 1:
            return 0
        return int(n[1:]) if n[0] in 'AG' else int(n.split('.')[1])

    def initial(self):
        locks = tuple(((), ()) for _ in self.objs)
        actors = tuple((0, 'R') for _ in range(self.n))
        return (locks, actors)

    # ---- lock manager
    def acquire(self, L, o, p, m, dont_wait):
        """('grant',) | ('queue', pos) | ('early', w) | ('refused',)"""
        g, q = L[o]
        if (p, m) in g:
            return ('grant',)
        others = any(h != p and conflict(m, hm) for h, hm in g)
        if not others and not any(conflict(m, wm) for _, wm in q):
            return ('grant',)
        mine = [hm for h, hm in g if h == p]
        pos = len(q)
        if mine and q:
            ahead = []
            for i, (w, wm) in enumerate(q):
                if any(conflict(wm, hm) for hm in mine):
                    if any(h == w and conflict(m, hm) for h, hm in g):
                        return ('refused',) if dont_wait else ('early', w)
                    if not others and not any(conflict(m, a) for a in ahead):
                        return ('grant',)
                    pos = i
                    break
                ahead.append(wm)
        if dont_wait:
            return ('refused',)
        return ('queue', pos)

    def wakeup(self, L, A, log):
        for o in range(len(L)):
            g, q = L[o]
            if not q:
                continue
            g = set(g)
            ahead, nq, changed = [], [], False
            for w, wm in q:
                if not any(conflict(wm, a) for a in ahead) and \
                        not any(h != w and conflict(wm, hm) for h, hm in g):
                    g.add((w, wm))
                    pc, _ = A[w]
                    A[w] = (pc + 1, 'R')
                    changed = True
                    log.append('%s gets %s %s' % (self.names[w],
                                                  self.objs[o], wm))
                else:
                    ahead.append(wm)
                    nq.append((w, wm))
            if changed:
                L[o] = (tuple(sorted(g)), tuple(nq))

    def release_all(self, L, p, only=None):
        for o in range(len(L)):
            if only is not None and self.oact[o] != only:
                continue
            g, q = L[o]
            ng = tuple(x for x in g if x[0] != p)
            nq = tuple(x for x in q if x[0] != p)
            if ng != g or nq != q:
                L[o] = (ng, nq)

    def waiting_on(self, L, p):
        for o, (g, q) in enumerate(L):
            for w, wm in q:
                if w == p:
                    return o, wm
        return None

    # ---- wait-for graph
    def graph(self, L, A=None):
        E = {}
        for p, (pc, st) in enumerate(A or ()):
            if st[0] == 'H':
                E.setdefault(p, set()).update(int(c) for c in st[1:])
        for o, (g, q) in enumerate(L):
            for i, (w, wm) in enumerate(q):
                s = E.setdefault(w, set())
                for h, hm in g:
                    if h != w and conflict(wm, hm):
                        s.add(h)
                for v, vm in q[:i]:
                    if v != w and conflict(wm, vm):
                        s.add(v)
        return E

    @staticmethod
    def reach(E, p):
        seen, st = set(), [p]
        while st:
            x = st.pop()
            for y in E.get(x, ()):
                if y not in seen:
                    seen.add(y)
                    st.append(y)
        return seen

    def cycle_members(self, E, p):
        r = self.reach(E, p)
        if p not in r:
            return None
        return frozenset(v for v in r if p in self.reach(E, v))

    def deadlock_check(self, L, p, A=None):
        """None (no cycle through p), ('reorder', L', members) or
        ('victim', members)."""
        key = (L, A, p)
        if key in self.dlcache:
            return self.dlcache[key]
        E = self.graph(L, A)
        mem = self.cycle_members(E, p)
        if mem is None:
            res = None
        else:
            res = ('victim', mem)
            objs = [o for o, (g, q) in enumerate(L)
                    if len(q) >= 2 and any(w in mem for w, _ in q)]
            cands = []
            for perms in itertools.product(
                    *[list(itertools.permutations(L[o][1])) for o in objs]):
                if all(pq == L[o][1] for o, pq in zip(objs, perms)):
                    continue
                inv = 0
                for o, pq in zip(objs, perms):
                    orig = L[o][1]
                    idx = [orig.index(x) for x in pq]
                    inv += sum(1 for i in range(len(idx))
                               for j in range(i + 1, len(idx))
                               if idx[i] > idx[j])
                cands.append((inv, perms))
            cands.sort(key=lambda c: c[0])
            for _, perms in cands:
                L2 = list(L)
                moved = {p}
                for o, pq in zip(objs, perms):
                    L2[o] = (L[o][0], pq)
                    if pq != L[o][1]:
                        moved.update(w for w, _ in pq)
                E2 = self.graph(L2, A)
                if all(self.cycle_members(E2, v) is None for v in moved):
                    res = ('reorder', tuple(L2), mem)
                    break
        self.dlcache[key] = res
        return res

    # ---- successors
    def holds_in_act(self, L, p, act):
        return any(h == p for o in self.actobj.get(act, ())
                   for h, _ in L[o][0])

    def successors(self, state):
        """List of (actor, movekind, label, newstate, events).
        movekind: 'step', 'check', 'timeout'.  events: list of
        (tag, data)."""
        L0, A0 = state
        out = []
        for p in range(self.n):
            pc, st = A0[p]
            nm = self.names[p]
            if st == 'R':
                out.extend(self.step(L0, A0, p))
            elif st[0] == 'H' and all(A0[int(c)][1] in 'DVT' for c in st[1:]):
                L, A, log = list(L0), list(A0), []
                A[p] = (pc + (self.progs[p][pc][0] == 'waitend'), 'R')
                out.append((p, 'step', '%s: the holders ended' % nm,
                            (tuple(L), tuple(A)), []))
            if st == 'W' or st[0] == 'H':
                r = self.deadlock_check(L0, p, A0)
                if r is not None:
                    L, A, log = list(r[1] if r[0] == 'reorder' else L0), \
                        list(A0), []
                    ev = [('cycle', (p, r[-1], r[0]))]
                    if r[0] == 'reorder':
                        lab = '%s: deadlock check, reorders wait queues' % nm
                    else:
                        lab = '%s: 40P01 (deadlock detected)' % nm
                        self.release_all(L, p)
                        A[p] = (pc, 'V')
                        ev.append(('victim', (p, r[-1])))
                    self.wakeup(L, A, log)
                    out.append((p, 'check', self.label(lab, log),
                                (tuple(L), tuple(A)), ev))
                if self.timeout[p]:
                    L, A, log = list(L0), list(A0), []
                    self.release_all(L, p)
                    A[p] = (pc, 'T')
                    self.wakeup(L, A, log)
                    out.append((p, 'timeout',
                                self.label('%s: 55P03 (lock timeout)' % nm,
                                           log),
                                (tuple(L), tuple(A)), [('timeout', p)]))
        return out

    @staticmethod
    def label(s, log):
        return s + (' [' + ', '.join(log) + ']' if log else '')

    def step(self, L0, A0, p):
        pc, _ = A0[p]
        ins = self.progs[p][pc]
        op = ins[0]
        nm = self.names[p]
        L, A, log, ev = list(L0), list(A0), [], []
        res = []

        def done(lab):
            self.wakeup(L, A, log)
            res.append((p, 'step', self.label(lab, log),
                        (tuple(L), tuple(A)), ev))

        if op == 'waitend':
            o, m = ins[1], ins[2]
            hs = sorted(set(h for h, hm in L[o][0]
                            if h != p and conflict(m, hm)))
            lab = '%s: waitend %s %s' % (nm, self.objs[o], m)
            if not hs:
                A[p] = (pc + 1, 'R')
                done(lab + ' -> no holder')
            else:
                A[p] = (pc, 'H' + ''.join(str(h) for h in hs))
                done(lab + ' -> waits for the end of %s' %
                     ', '.join(self.names[h] for h in hs))
        elif op in ('wait', 'waitnow', 'tryfree'):
            o, m = ins[1], ins[2]
            on = self.objs[o]
            lab = '%s: %s %s %s' % (nm, op, on, m)
            if self.kinds[p] in TRYWALKER and op == 'wait':
                ev.append(('P4', 'try-walker calls wait'))
            r = self.acquire(L, o, p, m, False)
            if r[0] == 'grant':
                g, q = L[o]
                L[o] = (tuple(sorted(set(g) | {(p, m)})), q)
                A[p] = (pc + 1, 'R')
                done(lab + ' -> granted')
            elif r[0] == 'early':
                self.release_all(L, p)
                A[p] = (pc, 'V')
                mem = frozenset((p, r[1]))
                ev.append(('cycle', (p, mem, 'early')))
                ev.append(('victim', (p, mem)))
                done(lab + ' -> 40P01 at once (early deadlock with %s)'
                     % self.names[r[1]])
            else:
                g, q = L[o]
                pos = r[1]
                L[o] = (g, q[:pos] + ((p, m),) + q[pos:])
                A[p] = (pc, 'W')
                if op != 'wait':
                    ev.append(('P6', '%s: %s %s not free' % (nm, on, m)))
                elif ins[3] and not self.multi[p] and \
                        self.holds_in_act(L0, p, self.oact[o]):
                    ev.append(('P5', '%s sleeps on %s holding locks of the '
                               'activity' % (nm, on)))
                done(lab + ' -> sleeps' +
                     ('' if pos == len(q) else ' (queued at %d)' % pos))
        elif op == 'try':
            o, m, els = ins[1], ins[2], ins[3]
            r = self.acquire(L, o, p, m, True)
            lab = '%s: try %s %s' % (nm, self.objs[o], m)
            if r[0] == 'grant':
                g, q = L[o]
                L[o] = (tuple(sorted(set(g) | {(p, m)})), q)
                A[p] = (pc + 1, 'R')
                done(lab + ' -> true')
            else:
                A[p] = (els, 'R')
                done(lab + ' -> false')
        elif op == 'rel':
            o, m = ins[1], ins[2]
            g, q = L[o]
            L[o] = (tuple(x for x in g if x != (p, m)), q)
            A[p] = (pc + 1, 'R')
            done('%s: release %s %s' % (nm, self.objs[o], m))
        elif op == 'relact':
            self.release_all(L, p, only=ins[1])
            A[p] = (pc + 1, 'R')
            done('%s: release all of the activity' % nm)
        elif op == 'goto':
            A[p] = (ins[1], 'R')
            done('%s: %s' % (nm, ins[2] or 'go on'))
        elif op == 'choose':
            for t in ins[1]:
                L, A, log, ev = list(L0), list(A0), [], []
                A[p] = (t, 'R')
                done('%s: %s' % (nm, ins[2][ins[1].index(t)]))
        elif op == 'idle':
            A[p] = (pc + 1, 'R')
            done('%s: %s' % (nm, ins[1]))
        elif op == 'leave':             # only in --selftest mutants
            A[p] = (pc, 'D')
            done('%s: ends without releasing' % nm)
        elif op == 'commit':
            self.release_all(L, p)
            A[p] = (pc, 'D')
            done('%s: commit' % nm)
        else:
            raise AssertionError(op)
        return res


# ------------------------------------------------------------------ checker

def tarjan(nsucc):
    n = len(nsucc)
    index = [-1] * n
    low = [0] * n
    onst = [False] * n
    st, comps, cnt = [], [], 0
    for root in range(n):
        if index[root] != -1:
            continue
        work = [(root, 0)]
        index[root] = low[root] = cnt
        cnt += 1
        st.append(root)
        onst[root] = True
        while work:
            v, i = work[-1]
            if i < len(nsucc[v]):
                work[-1] = (v, i + 1)
                w = nsucc[v][i]
                if index[w] == -1:
                    index[w] = low[w] = cnt
                    cnt += 1
                    st.append(w)
                    onst[w] = True
                    work.append((w, 0))
                elif onst[w]:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    u = work[-1][0]
                    low[u] = min(low[u], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = st.pop()
                        onst[w] = False
                        comp.append(w)
                        if w == v:
                            break
                    comps.append(comp)
    return comps


def may_lose(M, v, mem):
    """Which single call a cycle may abort.  No cycle is made of single
    calls alone; one that a multi-call transaction closes can abort a claim
    or batch in it (one that holds a user or stripe the transaction waits
    for, or one queued on such a lock: PostgreSQL's check fails whichever
    waiter finds the cycle), never a walker, a try-walker, a reversal or a
    wallet."""
    if M.old:
        return False
    if M.kinds[v] == 'claim':
        return False
    return M.kinds[v] in CLAIM_KINDS and any(M.multi[m] for m in mem)


def check(cfg, old=False):
    M = Model(cfg, old)
    init = M.initial()
    ids = {init: 0}
    states = [init]
    parent = [None]
    edges = []          # per state: list of (succ, actor, kind)
    fails = {}          # property -> (state id, label, message)
    victims = set()
    cycle_kinds = set()
    soft = set()
    old_found = None
    wallet = [i for i, k in enumerate(M.kinds) if k == 'wallet']
    dq = deque([0])

    def fail(prop, sid, lab, msg):
        if prop not in fails:
            fails[prop] = (sid, lab, msg)

    while dq:
        sid = dq.popleft()
        st = states[sid]
        L, A = st
        succ = M.successors(st)
        es = []
        for (p, kind, lab, ns, ev) in succ:
            nid = ids.get(ns)
            if nid is None:
                nid = len(states)
                ids[ns] = nid
                states.append(ns)
                parent.append((sid, lab))
                dq.append(nid)
            es.append((nid, p, kind))
            for tag, data in ev:
                if tag == 'victim':
                    v, mem = data
                    victims.add(M.kinds[v])
                    if not M.multi[v] and not may_lose(M, v, mem):
                        fail('P1', sid, lab, '%s (%s, a single call) is a '
                             '40P01 victim' % (M.names[v], M.kinds[v]))
                    if M.multi[v] and any(not M.multi[x] for x in mem):
                        if old_found is None:
                            old_found = (sid, lab)
                elif tag == 'cycle':
                    v, mem, how = data
                    cycle_kinds.add(tuple(sorted(M.names[x] for x in mem)))
                    if how == 'reorder':
                        soft.add(tuple(sorted(M.names[x] for x in mem)))
                    if any(not M.multi[x] and not may_lose(M, x, mem)
                           for x in mem) and (how != 'reorder' or STRICT):
                        fail('P1c', sid, lab, 'cycle {%s} (%s) contains a '
                             'single call' % (', '.join(sorted(
                                 M.names[x] for x in mem)), how))
                else:
                    fail(tag, sid, lab, data)
        edges.append(es)
        # P2: stuck
        unfinished = [p for p in range(M.n) if A[p][1][0] in 'RWH']
        if unfinished and not any(k != 'timeout' for _, _, k in es):
            fail('P2', sid, None, 'no move (other than a lock timeout) '
                 'while %s unfinished' % ', '.join(M.names[p]
                                                   for p in unfinished))
        # P7: a single claim never waits (transitively) for the wallet
        if wallet:
            E = None
            for p in range(M.n):
                if A[p][1][0] in 'WH' and M.kinds[p] in SINGLE_CLAIM:
                    E = E or M.graph(L, A)
                    if any(w in M.reach(E, p) for w in wallet):
                        fail('P7', sid, None, '%s waits (transitively) for '
                             'the wallet' % M.names[p])
    # P2: livelock under weak fairness
    nsucc = [[e[0] for e in es] for es in edges]
    live = None
    for comp in tarjan(nsucc):
        cs = set(comp)
        if len(comp) == 1 and comp[0] not in nsucc[comp[0]]:
            continue
        steps = set()
        for v in comp:
            for (w, p, k) in edges[v]:
                if w in cs:
                    steps.add(p)
        unfair = False
        for p in range(M.n):
            if p in steps:
                continue
            if all(any(e[1] == p and e[2] != 'timeout' for e in edges[v])
                   for v in comp):
                unfair = True
                break
        if not unfair:
            live = comp
            break
    if live is not None:
        entry = min(live)
        cyc = cycle_in(entry, set(live), edges, parent, states, M)
        fails['P2L'] = (entry, None, 'livelock: a fair cycle that never '
                        'finishes, reached by', cyc)
    M.soft = soft
    M.states = states
    return M, len(states), fails, victims, cycle_kinds, old_found, parent


def cycle_in(entry, cs, edges, parent, states, M):
    """A shortest cycle from entry back to entry inside cs, as labels."""
    prev = {entry: None}
    dq = deque([entry])
    while dq:
        v = dq.popleft()
        for (w, p, k) in edges[v]:
            if w not in cs:
                continue
            if w == entry:
                path = []
                x = v
                # labels: recompute from successors
                path.append(edge_label(M, states, v, w))
                while prev[x] is not None:
                    path.append(edge_label(M, states, prev[x], x))
                    x = prev[x]
                return list(reversed(path))
            if w not in prev:
                prev[w] = v
                dq.append(w)
    return ['?']


def edge_label(M, states, v, w):
    for (p, k, lab, ns, ev) in M.successors(states[v]):
        if ns == states[w]:
            return lab
    return '?'


def trace(parent, sid, lab):
    steps = []
    x = sid
    while parent[x] is not None:
        px, plab = parent[x]
        steps.append(plab)
        x = px
    steps.reverse()
    if lab:
        steps.append(lab)
    return steps


def fmt_state(M, st):
    L, A = st
    out = []
    for o, (g, q) in enumerate(L):
        if g or q:
            out.append('%s granted {%s} queue [%s]' % (
                M.objs[o], ', '.join('%s %s' % (M.names[h], m) for h, m in g),
                ', '.join('%s %s' % (M.names[w], m) for w, m in q)))
    return '; '.join(out)


def run(cfgs, old):
    npass = nfail = 0
    found = False
    for cfg in cfgs:
        t0 = time.time()
        M, n, fails, victims, cyc, old_found, parent = check(cfg, old)
        dt = time.time() - t0
        vk = ','.join(sorted(victims)) or '-'
        if old:
            ok = old_found is not None
            print('%s: %d states, victims {%s}, %.1fs: %s' % (
                cfg[0], n, vk, dt, 'violation found' if ok else
                'no violation'))
            if ok and not found:
                found = True
                sid, lab = old_found
                print('  a multi-call transaction loses (40P01) to a '
                      'single call:')
                for s in trace(parent, sid, lab):
                    print('    ' + s)
            continue
        bad = [p for p in ('P1', 'P1c', 'P2', 'P2L', 'P4', 'P5', 'P6', 'P7')
               if p in fails]
        if bad:
            nfail += 1
        else:
            npass += 1
        print('%s: %d states, victims {%s}, %.1fs: %s' % (
            cfg[0], n, vk, dt, 'FAIL ' + ','.join(sorted(set(
                b[:2] for b in bad))) if bad else 'ok'))
        if M.soft:
            print('  soft cycles resolved by reordering a wait queue: %s' %
                  ' '.join('{%s}' % ', '.join(c) for c in sorted(M.soft)))
        for p in bad:
            sid, lab, msg = fails[p][:3]
            print('  %s: %s' % (p[:2], msg))
            if p == 'P1c' and 'P1' in fails and fails['P1'][:2] == (sid, lab):
                print('    (same trace as above)')
                continue
            for s in trace(parent, sid, lab):
                print('    ' + s)
            if lab is None:
                print('    state: ' + fmt_state(M, check_state(parent, sid,
                                                               M)))
            if p == 'P2L':
                print('    then forever:')
                for s in fails[p][3]:
                    print('      ' + s)
    if not NOHOLD:
        print('queued single claims: a claim is a victim' if nfail else
              'queued single claims: no victim found (the model is wrong)')
        return 0 if nfail else 1
    if old:
        print('old protocol: violation found' if found else
              'old protocol: no violation found (the model is wrong)')
        return 0 if found else 1
    print('%d passed, %d failed' % (npass, nfail))
    return 0 if nfail == 0 else 1


def check_state(parent, sid, M):
    return M.states[sid]


def selftest():
    bad = 0
    for prop, cfg in SELFTESTS:
        M, n, fails, victims, cyc, old_found, parent = check(cfg, False)
        got = sorted(set(p[:2] for p in fails))
        ok = prop in got
        bad += not ok
        print('%s: %d states, expects %s, finds {%s}: %s' % (
            cfg[0], n, prop, ','.join(got), 'ok' if ok else 'FAIL'))
    print('selftest: %d of %d mutants caught' % (len(SELFTESTS) - bad,
                                                  len(SELFTESTS)))
    return 1 if bad else 0


def main(argv):
    if '--selftest' in argv:
        return selftest()
    global STRICT, NOHOLD
    STRICT = '--strict-cycles' in argv
    NOHOLD = '--queued' not in argv
    old = '--old' in argv
    cfgs = OLD_CONFIGS + CONFIGS if old else CONFIGS
    if '--list' in argv:
        for c in CONFIGS + OLD_CONFIGS:
            print(c[0])
        return 0
    if '--config' in argv:
        i = argv.index('--config')
        if i + 1 >= len(argv):
            print('--config needs a name')
            return 2
        want = argv[i + 1]
        cfgs = [c for c in CONFIGS + OLD_CONFIGS if c[0] == want]
        if not cfgs:
            print('unknown configuration %s' % want)
            return 2
    return run(cfgs, old)


if __name__ == '__main__':
    import signal
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    sys.exit(main(sys.argv[1:]))
