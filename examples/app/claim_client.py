#!/usr/bin/env python3
"""How an application calls redpacket.rp_claim (README "Calling from an
application"), runnable: test/t/014_client_example.pl drives it.

    python3 claim_client.py DSN ACTIVITY USERS [--threads N] [--isolation LEVEL]
            [--amount X] [--lock-timeout-ms MS] [--uncertain-every K]

Each of USERS users claims once, from N threads, each call in its own short
transaction.  It prints one JSON line: the outcome counts, the retries by
SQLSTATE, and how many simulated uncertain commits were resolved by a
'duplicate' answer carrying the same claim id.
"""
import argparse
import json
import random
import threading
import time

import psycopg2
import psycopg2.extensions

# Worth retrying the whole transaction: serialization failure, deadlock,
# lock timeout, statement timeout.  Business outcomes (exhausted, ended, ...)
# are statuses, not errors, and are never retried.
RETRYABLE = {"40001", "40P01", "55P03", "57014"}
MAX_ATTEMPTS = 10


class UncertainCommit(Exception):
    """Stands for a connection lost after COMMIT was sent: did it commit?
    (The claim id is kept only so that the test can check the answer.)"""

    def __init__(self, claim_id):
        super().__init__("connection lost after COMMIT")
        self.claim_id = claim_id


def claim(conn, activity, user_id, amount=None, request_id=None, fail_after_commit=False):
    """One claim with retries; returns (status, claim_id, amount, retries,
    the claim id of a simulated uncertain commit or None)."""
    retries = {}
    lost = None
    for attempt in range(1, MAX_ATTEMPTS + 1):
        try:
            with conn.cursor() as cur:
                cur.execute(
                    "SELECT status, claim_id, amount FROM redpacket.rp_claim(%s, %s, %s, %s)",
                    (activity, user_id, amount, request_id))
                status, claim_id, got = cur.fetchone()
            conn.commit()
            if fail_after_commit:
                fail_after_commit = False
                raise UncertainCommit(claim_id)
            return status, claim_id, got, retries, lost
        except UncertainCommit as e:
            lost = e.claim_id
            # We cannot know whether the claim committed: call again with the
            # same key.  'duplicate' means the first call succeeded, and it
            # carries the original claim id and amount.
            retries["uncertain"] = retries.get("uncertain", 0) + 1
            continue
        except psycopg2.Error as e:
            conn.rollback()
            if e.pgcode not in RETRYABLE or attempt == MAX_ATTEMPTS:
                raise
            retries[e.pgcode] = retries.get(e.pgcode, 0) + 1
            # back off with jitter so that the retries do not collide again
            time.sleep(random.uniform(0, 0.01 * 2 ** min(attempt, 6)))
    raise RuntimeError("unreachable")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dsn")
    ap.add_argument("activity", type=int)
    ap.add_argument("users", type=int)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--isolation", default="read_committed",
                    choices=["read_committed", "repeatable_read", "serializable"])
    ap.add_argument("--amount", default=None)
    ap.add_argument("--lock-timeout-ms", type=int, default=0)
    ap.add_argument("--uncertain-every", type=int, default=0)
    ap.add_argument("--prefix", default="user")
    args = ap.parse_args()

    levels = {
        "read_committed": psycopg2.extensions.ISOLATION_LEVEL_READ_COMMITTED,
        "repeatable_read": psycopg2.extensions.ISOLATION_LEVEL_REPEATABLE_READ,
        "serializable": psycopg2.extensions.ISOLATION_LEVEL_SERIALIZABLE,
    }
    lock = threading.Lock()
    summary = {"statuses": {}, "retries": {}, "uncertain_resolved": 0, "errors": []}

    def worker(idx):
        conn = psycopg2.connect(args.dsn)
        conn.set_isolation_level(levels[args.isolation])
        if args.lock_timeout_ms:
            with conn.cursor() as cur:
                cur.execute("SET lock_timeout = %s", (f"{args.lock_timeout_ms}ms",))
            conn.commit()
        for u in range(idx, args.users, args.threads):
            user = f"{args.prefix}{u}"
            uncertain = args.uncertain_every > 0 and u % args.uncertain_every == 0
            try:
                status, claim_id, got, retries, lost = claim(
                    conn, args.activity, user, args.amount, None, uncertain)
            except Exception as e:  # report, do not hide
                with lock:
                    summary["errors"].append(f"{user}: {e}")
                continue
            with lock:
                summary["statuses"][status] = summary["statuses"].get(status, 0) + 1
                for k, v in retries.items():
                    summary["retries"][k] = summary["retries"].get(k, 0) + v
                if uncertain and status == "duplicate" and lost == claim_id:
                    summary["uncertain_resolved"] += 1
        conn.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(args.threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps(summary, sort_keys=True))


if __name__ == "__main__":
    main()
