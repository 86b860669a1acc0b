#!/usr/bin/env python3
"""The example wallet service that keeps no inbox (doc/wallet.md, "Without
an inbox"), runnable: test/t/119_wallet_poller.pl drives it.

    python3 poller.py WALLET_DSN REDPACKET_DSN [--batch N] [--older-than S]
            [--until-idle] [--run-for S] [--die-after note|ack|pay]

The wallet database (poller.sql) holds the wallets, one payment row per
claim paid, and the batches.  The poller keeps no copy of the claims: it
asks rp_pending_credits for them.  A batch (claims of one activity) is
  1. noted: its reference committed in poller_batch;
  2. acknowledged: rp_credited(activity, claim ids, reference).  From then on
     the claims cannot be reversed; a claim the operator reversed before
     makes the call fail (55000) and is left out;
  3. paid: what rp_credits(reference) returns goes into poller_payment (its
     primary key makes a second payment impossible) and the wallets, and
     the batch is marked paid, in one wallet transaction.
One poller runs per wallet: it holds a session advisory lock in the wallet
database while it runs (another refuses to start), since its recovery
takes every unpaid batch for one it died in.  On start it pays every noted
batch not marked paid, from rp_credits.  Killed
after 1, that pays nothing (the claims are still pending and come back);
after 2 it pays the batch; after 3 nothing is left to do.  Acknowledging
first keeps a paid claim from being reversed; the note and rp_credits keep
a claim acknowledged from going unpaid when the poller dies before paying.

It prints one JSON line when it stops: what it paid, acknowledged, skipped
as reversed and recovered.
"""
import argparse
import json
import os
import signal
import sys
import time

import psycopg2

from consumer import acknowledge, die_if, on_term
import consumer

PAY = """
WITH due AS (
    SELECT * FROM unnest(%(a)s::bigint[], %(c)s::bigint[], %(u)s::text[], %(m)s::numeric[])
                  AS t(activity_id, claim_id, user_id, amount)),
paid AS (
    INSERT INTO poller_payment (activity_id, claim_id, user_id, amount, reference)
    SELECT activity_id, claim_id, user_id, amount, %(ref)s FROM due
    ON CONFLICT (activity_id, claim_id) DO NOTHING
    RETURNING user_id, amount),
per_user AS (
    SELECT user_id, sum(amount) AS amount FROM paid GROUP BY user_id),
add AS (
    INSERT INTO poller_wallet (user_id, balance) SELECT user_id, amount FROM per_user
    ON CONFLICT (user_id) DO UPDATE SET balance = poller_wallet.balance + EXCLUDED.balance),
done AS (
    UPDATE poller_batch SET paid = true WHERE reference = %(ref)s)
SELECT count(*) FROM paid
"""


def pay(wallet, rp, reference, stats):
    """Pay what was acknowledged under reference, and mark the batch paid."""
    with rp.cursor() as cur:
        cur.execute("SELECT activity_id, claim_id, user_id, amount"
                    "  FROM redpacket.rp_credits(%s)", (reference,))
        rows = cur.fetchall()
    cols = [list(c) for c in zip(*rows)] if rows else [[], [], [], []]
    with wallet.cursor() as cur:
        cur.execute(PAY, {"a": cols[0], "c": cols[1], "u": cols[2], "m": cols[3],
                          "ref": reference})
        stats["paid"] += cur.fetchone()[0]
    wallet.commit()


def recover(wallet, rp, stats):
    """Pay every batch noted and not marked paid (a crash before step 3)."""
    with wallet.cursor() as cur:
        cur.execute("SELECT reference FROM poller_batch WHERE NOT paid ORDER BY noted_at, reference")
        refs = [r[0] for r in cur.fetchall()]
    wallet.commit()
    for reference in refs:
        pay(wallet, rp, reference, stats)
        stats["recovered"] += 1


def poll_once(args, wallet, rp, stats):
    """One batch: note, acknowledge, pay.  Returns how many claims it took."""
    with rp.cursor() as cur:
        cur.execute("SELECT activity_id, claim_id"
                    "  FROM redpacket.rp_pending_credits(NULL, make_interval(secs => %s))",
                    (args.older_than,))
        rows = cur.fetchall()
    if not rows:
        return 0
    activity = rows[0][0]
    ids = [c for a, c in rows if a == activity][:args.batch]
    stats["batches"] += 1
    reference = "wallet-poller:%d:%d:%d" % (os.getpid(), time.time_ns(), stats["batches"])
    with wallet.cursor() as cur:
        cur.execute("INSERT INTO poller_batch (reference) VALUES (%s)", (reference,))
    wallet.commit()
    die_if(args, "note", stats)
    acknowledge(rp, activity, ids, reference, stats, lambda gone: None)
    die_if(args, "ack", stats)
    pay(wallet, rp, reference, stats)
    die_if(args, "pay", stats)
    return len(ids)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("wallet_dsn")
    ap.add_argument("redpacket_dsn")
    ap.add_argument("--batch", type=int, default=10000, help="claims per rp_credited call")
    ap.add_argument("--poll", type=float, default=0.2, help="seconds between empty polls")
    ap.add_argument("--older-than", type=float, default=0.0,
                    help="take claims at least this many seconds old")
    ap.add_argument("--until-idle", action="store_true", help="stop when nothing is pending")
    ap.add_argument("--run-for", type=float, default=0, help="stop after this many seconds")
    ap.add_argument("--die-after", choices=["note", "ack", "pay"],
                    help="test hook: SIGKILL itself after the first note, acknowledgement or payment")
    args = ap.parse_args()

    signal.signal(signal.SIGTERM, on_term)
    wallet = psycopg2.connect(args.wallet_dsn)
    with wallet.cursor() as cur:
        cur.execute("SELECT pg_try_advisory_lock(hashtext('redpacket wallet poller'))")
        alone = cur.fetchone()[0]
    wallet.commit()
    if not alone:
        sys.exit("poller: another poller runs for this wallet (it holds the advisory lock)")
    rp = psycopg2.connect(args.redpacket_dsn)
    rp.autocommit = True  # every rp_credited in a transaction of its own
    stats = {"paid": 0, "acknowledged": 0, "reversed_skipped": 0, "batches": 0, "recovered": 0}
    recover(wallet, rp, stats)
    start = time.monotonic()
    while not consumer.stopping:
        n = poll_once(args, wallet, rp, stats)
        if args.run_for and time.monotonic() - start >= args.run_for:
            break
        if n == 0:
            if args.until_idle:
                break
            time.sleep(args.poll)
    print(json.dumps(stats, sort_keys=True))


if __name__ == "__main__":
    main()
