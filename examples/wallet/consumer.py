#!/usr/bin/env python3
"""The example wallet service (README "Settling with a wallet"), runnable:
test/t/013_wallet_cdc.pl drives it.

    python3 consumer.py WALLET_DSN REDPACKET_DSN [--batch N] [--poll S]
            [--redrive-every S] [--older-than S] [--until-idle] [--run-for S]
            [--die-after ack|pay]

The wallet database (subscriber.sql) subscribes to redpacket's publication:
claims arrive in redpacket.claim and, by a trigger, in wallet_inbox; a
reversal arriving in redpacket.claim_settlement marks its inbox row.  This
program pays the inbox into the wallets, exactly once, and acknowledges
every claim it pays with redpacket.rp_credited.

The order of a batch is the point:
  1. acknowledge first: rp_credited(activity, claim ids).  From then on the
     claims cannot be reversed (rp_reverse refuses a credited claim), and a
     claim the operator reversed before it makes the call fail (55000): it
     is marked reversed and left out, and the rest acknowledged again;
  2. then pay: one wallet-database transaction inserts a wallet_credit row
     per claim (its primary key makes a second payment impossible), adds to
     the wallets, and takes the claims out of the inbox.
Killed between 1 and 2, it finds the claims still in the inbox when it
starts again, acknowledges them again (rp_credited skips what it already
credited) and pays them.  Paying first and acknowledging after would leave
a window in which a reversal lands on a claim already paid.

Messages can be lost (a subscription dropped and made again, a slot lost):
every --redrive-every seconds, and once at start, it asks rp_pending_credits
for the claims neither credited nor reversed that are older than
--older-than seconds and puts them in the inbox.

It prints one JSON line when it stops: what it paid, acknowledged, skipped
as reversed and re-drove.
"""
import argparse
import json
import os
import random
import signal
import sys
import time

import psycopg2

# Worth retrying: serialization failure, deadlock, lock timeout, statement
# timeout.
RETRYABLE = {"40001", "40P01", "55P03", "57014"}
REVERSED = "55000"  # object_not_in_prerequisite_state: a claim was reversed
MAX_ATTEMPTS = 10

stopping = False


def on_term(signum, frame):
    global stopping
    stopping = True


def die_if(args, point, stats):
    """Test hook: SIGKILL ourselves at a point of a batch, once."""
    if args.die_after == point:
        sys.stdout.write(json.dumps(dict(stats, died_after=point), sort_keys=True) + "\n")
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)


def reversed_among(rp, activity, ids):
    with rp.cursor() as cur:
        cur.execute(
            "SELECT claim_id FROM redpacket.claim_settlement"
            " WHERE activity_id = %s AND claim_id = ANY (%s::bigint[]) AND state = 'reversed'",
            (activity, ids))
        return {r[0] for r in cur.fetchall()}


def mark_reversed(wallet, activity, ids):
    with wallet.cursor() as cur:
        cur.execute(
            "UPDATE wallet_inbox SET reversed = true"
            " WHERE activity_id = %s AND claim_id = ANY (%s::bigint[])",
            (activity, list(ids)))
    wallet.commit()


def acknowledge(rp, activity, ids, reference, stats, on_reversed):
    """rp_credited for ids; returns the ids acknowledged (the reversed ones
    left out, after on_reversed(their ids)).  Any other refusal (an unknown
    claim: the wallet and the books disagree) stops the program: an operator
    must look.  poller.py uses it too."""
    for attempt in range(1, MAX_ATTEMPTS + 1):
        if not ids:
            return ids
        try:
            with rp.cursor() as cur:
                cur.execute("SELECT redpacket.rp_credited(%s, %s::bigint[], %s)",
                            (activity, ids, reference))
                stats["acknowledged"] += cur.fetchone()[0]
            return ids
        except psycopg2.Error as e:
            if e.pgcode == REVERSED:
                gone = reversed_among(rp, activity, ids)
                if not gone:
                    raise
                on_reversed(gone)
                stats["reversed_skipped"] += len(gone)
                ids = [i for i in ids if i not in gone]
                continue
            if e.pgcode in RETRYABLE and attempt < MAX_ATTEMPTS:
                time.sleep(random.uniform(0, 0.01 * 2 ** attempt))
                continue
            raise
    raise RuntimeError("rp_credited kept failing")


PAY = """
WITH paid AS (
    INSERT INTO wallet_credit (activity_id, claim_id, user_id, amount)
    SELECT activity_id, claim_id, user_id, amount FROM wallet_inbox
     WHERE activity_id = %(a)s AND claim_id = ANY (%(ids)s::bigint[]) AND NOT reversed
    ON CONFLICT (activity_id, claim_id) DO NOTHING
    RETURNING user_id, amount),
per_user AS (
    SELECT user_id, sum(amount) AS amount FROM paid GROUP BY user_id),
add AS (
    INSERT INTO wallet (user_id, balance) SELECT user_id, amount FROM per_user
    ON CONFLICT (user_id) DO UPDATE SET balance = wallet.balance + EXCLUDED.balance),
done AS (
    DELETE FROM wallet_inbox
     WHERE activity_id = %(a)s AND claim_id = ANY (%(ids)s::bigint[]) AND NOT reversed)
SELECT count(*) FROM paid
"""


def pay(wallet, activity, ids, stats):
    with wallet.cursor() as cur:
        cur.execute(PAY, {"a": activity, "ids": ids})
        stats["paid"] += cur.fetchone()[0]
    wallet.commit()


def drain_once(args, wallet, rp, stats):
    """One batch of the inbox: acknowledge, then pay.  Returns its size."""
    with wallet.cursor() as cur:
        cur.execute(
            "SELECT activity_id, claim_id FROM wallet_inbox WHERE NOT reversed"
            " ORDER BY activity_id, claim_id LIMIT %s", (args.batch,))
        rows = cur.fetchall()
    wallet.commit()
    by_activity = {}
    for activity, claim_id in rows:
        by_activity.setdefault(activity, []).append(claim_id)
    for activity, ids in by_activity.items():
        stats["batches"] += 1
        reference = "wallet-example:%d:%d" % (os.getpid(), stats["batches"])
        ids = acknowledge(rp, activity, ids, reference, stats,
                          lambda gone: mark_reversed(wallet, activity, gone))
        die_if(args, "ack", stats)
        if ids:
            pay(wallet, activity, ids, stats)
        die_if(args, "pay", stats)
    return len(rows)


def redrive(args, wallet, rp, stats):
    """Claims nobody settled, older than --older-than, into the inbox."""
    with rp.cursor() as cur:
        cur.execute(
            "SELECT activity_id, claim_id, user_id, amount"
            "  FROM redpacket.rp_pending_credits(NULL, make_interval(secs => %s))",
            (args.older_than,))
        rows = cur.fetchall()
    with wallet.cursor() as cur:
        cur.execute(
            "INSERT INTO wallet_inbox (activity_id, claim_id, user_id, amount)"
            " SELECT t.a, t.c, t.u, t.m"
            "   FROM unnest(%s::bigint[], %s::bigint[], %s::text[], %s::numeric[]) AS t(a, c, u, m)"
            "  WHERE NOT EXISTS (SELECT FROM wallet_credit w"
            "                     WHERE w.activity_id = t.a AND w.claim_id = t.c)"
            " ON CONFLICT DO NOTHING",
            [list(col) for col in zip(*rows)] if rows else [[], [], [], []])
        added = cur.rowcount
    wallet.commit()
    stats["redriven"] += added
    return added


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("wallet_dsn")
    ap.add_argument("redpacket_dsn")
    ap.add_argument("--batch", type=int, default=10000,
                    help="claims per rp_credited call (at most 10,000 is a good size)")
    ap.add_argument("--poll", type=float, default=0.2, help="seconds between empty polls")
    ap.add_argument("--redrive-every", type=float, default=60.0)
    ap.add_argument("--older-than", type=float, default=60.0)
    ap.add_argument("--until-idle", action="store_true",
                    help="stop when the inbox is empty and a re-drive finds nothing")
    ap.add_argument("--run-for", type=float, default=0, help="stop after this many seconds")
    ap.add_argument("--die-after", choices=["ack", "pay"],
                    help="test hook: SIGKILL itself after the first acknowledgement or payment")
    args = ap.parse_args()

    signal.signal(signal.SIGTERM, on_term)
    wallet = psycopg2.connect(args.wallet_dsn)
    rp = psycopg2.connect(args.redpacket_dsn)
    rp.autocommit = True  # every rp_credited in a transaction of its own
    stats = {"paid": 0, "acknowledged": 0, "reversed_skipped": 0, "redriven": 0, "batches": 0}
    start = time.monotonic()
    last_redrive = None
    while not stopping:
        now = time.monotonic()
        redriven = None
        if last_redrive is None or now - last_redrive >= args.redrive_every:
            redriven = redrive(args, wallet, rp, stats)
            last_redrive = now
        n = drain_once(args, wallet, rp, stats)
        if args.run_for and time.monotonic() - start >= args.run_for:
            break
        if n == 0:
            if args.until_idle and redriven == 0:
                break
            if args.until_idle:
                last_redrive = None  # idle: one more re-drive decides
            time.sleep(args.poll)
    print(json.dumps(stats, sort_keys=True))


if __name__ == "__main__":
    main()
