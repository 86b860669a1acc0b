-- The wallet database of the example poller (poller.py): a wallet service
-- that keeps no inbox of claims.  It polls rp_pending_credits, notes a
-- reference, acknowledges under it, and pays what rp_credits returns for it.
-- Run it in the wallet database; the extension need not be installed here.

-- The wallets, and one row per claim paid into one: its primary key makes a
-- payment happen once, however often a batch is paid again.
CREATE TABLE poller_wallet (
    user_id text PRIMARY KEY,
    balance numeric NOT NULL);
CREATE TABLE poller_payment (
    activity_id bigint,
    claim_id    bigint,
    user_id     text NOT NULL,
    amount      numeric NOT NULL,
    reference   text NOT NULL,
    PRIMARY KEY (activity_id, claim_id));

-- The batches the poller acknowledged or was about to: a row is committed
-- before rp_credited runs with its reference, and marked paid in the
-- transaction that pays the batch.  An unpaid row after a crash is a batch
-- to pay from rp_credits(reference): empty if the crash came before the
-- acknowledgement.
CREATE TABLE poller_batch (
    reference text PRIMARY KEY,
    noted_at  timestamptz NOT NULL DEFAULT now(),
    paid      boolean NOT NULL DEFAULT false);
