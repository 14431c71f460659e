//! The node's wallet: the keys it hands out (receive and change addresses, each
//! channel's final and commit keys), the scripts the watcher looks for, coin selection
//! and the anchors it funds from confirmed outputs.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use bitcoin::hashes::Hash as _;
use bitcoin::{Amount, FeeRate, OutPoint, ScriptBuf, Transaction, TxOut};
use chain::Chain;
use secp256k1::SecretKey;
use wallet::{KeyPath, SpendableOutput};

use crate::manager::lock;
use crate::store::{ChannelId, MetaKey, OutputRow, Store, StoreError};

/// Wallet branch of channel final keys (sweeps and closes pay there, so the wallet sees them).
pub(crate) const FINAL_BRANCH: u32 = 2;
/// Wallet branch of channel commit keys (the anchor 2-of-2).
pub(crate) const COMMIT_BRANCH: u32 = 3;

/// A new channel's keys, from the wallet's channel branches.
pub(crate) struct ChannelKeys {
    /// Signs its commitments (the anchor's 2-of-2).
    pub(crate) commit: SecretKey,
    /// Receives its payouts (closes, claims, penalties).
    pub(crate) final_key: SecretKey,
}

/// The wallet outputs as `listfunds` shows them: outputs and the height they are judged at.
pub(crate) struct Funds {
    /// Confirmed outputs, not spent on chain and not reserved by an anchor of ours.
    pub(crate) outputs: Vec<OutputRow>,
    /// The height confirmations count to.
    pub(crate) tip: i64,
}

/// Why the wallet could not do what was asked; the control API turns it into its
/// [`ControlError`](crate::control_error::ControlError) (same message, same code).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum NodeWalletError {
    /// The database failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A key could not be derived from the wallet seed.
    #[error(transparent)]
    Keys(#[from] wallet::WalletError),
    /// The spendable outputs cannot pay the amount and its transaction's fee.
    #[error("insufficient funds: {asked_sat} sat asked, {needed_sat} sat needed with the transaction's fee, {spendable_sat} sat spendable")]
    InsufficientFunds {
        /// Asked.
        asked_sat: u64,
        /// Asked plus the fee of the transaction that pays it.
        needed_sat: u64,
        /// Confirmed and mature in the wallet.
        spendable_sat: u64,
    },
    /// The anchor could not be built or signed.
    #[error("cannot build the anchor")]
    Funding(#[from] wallet::SpendError),
}

/// The node's keys, watched scripts and coins.
pub(crate) struct NodeWallet {
    keys: wallet::Wallet,
    /// Scripts of every key the wallet handed out → their derivation path.
    scripts: Mutex<HashMap<ScriptBuf, KeyPath>>,
    /// One anchor is funded at a time, so two opens never pick the same outputs.
    funding: tokio::sync::Mutex<()>,
    store: Store,
    chain: Arc<dyn Chain>,
}

impl NodeWallet {
    pub(crate) fn new(keys: wallet::Wallet, store: Store, chain: Arc<dyn Chain>) -> NodeWallet {
        NodeWallet {
            keys,
            scripts: Mutex::default(),
            funding: tokio::sync::Mutex::new(()),
            store,
            chain,
        }
    }

    /// The keys of the channel with wallet index `index`; its final key is watched from now.
    pub(crate) fn channel_keys(&self, index: u32) -> Result<ChannelKeys, wallet::WalletError> {
        let final_path = KeyPath {
            branch: FINAL_BRANCH,
            index,
        };
        let final_key = self.keys.derive(final_path)?;
        let commit = self.keys.derive(KeyPath {
            branch: COMMIT_BRANCH,
            index,
        })?;
        self.watch_script(final_key.address.script_pubkey(), final_path);
        Ok(ChannelKeys {
            commit: commit.secret_key,
            final_key: final_key.secret_key,
        })
    }

    fn watch_script(&self, script: ScriptBuf, path: KeyPath) {
        lock(&self.scripts).insert(script, path);
    }

    /// The derivation path of a script the wallet handed out, if it is one.
    pub(crate) fn script_path(&self, script: &ScriptBuf) -> Option<KeyPath> {
        lock(&self.scripts).get(script).copied()
    }

    /// How many scripts the watcher looks for.
    pub(crate) fn watched_scripts(&self) -> usize {
        lock(&self.scripts).len()
    }

    /// Stops watching the final key of a channel abandoned before it went live (nothing
    /// can pay it).
    pub(crate) fn unwatch_final_key(&self, channel: ChannelId) {
        let Some(index) = channel.index() else {
            return;
        };
        if let Ok(key) = self.keys.derive(KeyPath {
            branch: FINAL_BRANCH,
            index,
        }) {
            lock(&self.scripts).remove(&key.address.script_pubkey());
        }
    }

    /// Rebuilds the script map from the counters, so every key the node handed out is watched.
    pub(crate) async fn load_scripts(&self) -> Result<(), NodeWalletError> {
        let mut map = HashMap::new();
        let forgotten: HashSet<u32> = self
            .store
            .abandoned_openings()
            .await?
            .into_iter()
            .filter_map(ChannelId::index)
            .collect();
        for (key, branch) in [
            (MetaKey::NextReceive, wallet::RECEIVE_BRANCH),
            (MetaKey::NextChange, wallet::CHANGE_BRANCH),
            (MetaKey::NextChannel, FINAL_BRANCH),
        ] {
            let n = self.store.meta(key).await?;
            for index in 0..u32::try_from(n).unwrap_or(0) {
                if branch == FINAL_BRANCH && forgotten.contains(&index) {
                    continue;
                }
                let path = KeyPath { branch, index };
                let key = self.keys.derive(path)?;
                map.insert(key.address.script_pubkey(), path);
            }
        }
        lock(&self.scripts).extend(map);
        Ok(())
    }

    /// The wallet's receive address (a fresh one per call).
    pub(crate) async fn new_address(&self) -> Result<bitcoin::Address, NodeWalletError> {
        let index = self.store.next_index(MetaKey::NextReceive).await?;
        let key = self.keys.derive(KeyPath::receive(index))?;
        self.watch_script(key.address.script_pubkey(), KeyPath::receive(index));
        Ok(key.address)
    }

    /// The outputs `listfunds` shows, and the height they are judged at.
    pub(crate) async fn funds(&self) -> Result<Funds, StoreError> {
        let outputs = self.store.outputs(true).await?;
        // The watcher records a block's outputs before it moves the scanned height past
        // that block: an output is never younger than its own block.
        let youngest = outputs.iter().map(|o| i64::from(o.height)).max();
        let tip = self
            .store
            .meta(MetaKey::ScannedHeight)
            .await?
            .max(youngest.unwrap_or(0));
        Ok(Funds { outputs, tip })
    }

    /// The fee rate of what the node builds (anchors, claims, penalties, the fair close fee):
    /// the chain's estimate for 6 blocks held to its fee policy (whose fallback also stands
    /// in when the chain cannot be asked).
    pub(crate) async fn fee_rate(&self) -> FeeRate {
        match self.chain.estimate_fee(6).await {
            Ok(rate) => rate,
            Err(e) => {
                let fallback = self.chain.fee_policy().fallback();
                tracing::warn!(error = %crate::error_report::Causes(&e), ?fallback, "no fee estimate from the chain; using the fallback");
                fallback
            }
        }
    }

    /// Wallet outputs as inputs, largest first, until they sum to `enough` (all of them
    /// without it).
    fn inputs(
        &self,
        mut outputs: Vec<OutputRow>,
        enough: Option<Amount>,
    ) -> Result<Vec<SpendableOutput>, wallet::WalletError> {
        outputs.sort_by_key(|o| std::cmp::Reverse(o.amount_sat));
        let mut inputs = Vec::new();
        let mut total = Amount::ZERO;
        for o in outputs {
            if enough.is_some_and(|e| total >= e) {
                break;
            }
            let path = KeyPath {
                branch: o.branch,
                index: o.index,
            };
            let key = self.keys.derive(path)?;
            total += Amount::from_sat(o.amount_sat);
            inputs.push(SpendableOutput {
                outpoint: o.outpoint,
                txout: TxOut {
                    value: Amount::from_sat(o.amount_sat),
                    script_pubkey: key.address.script_pubkey(),
                },
                path,
            });
        }
        Ok(inputs)
    }

    /// Refuses an anchor of `amount_sat` that the wallet's spendable outputs cannot pay
    /// together with its fee. Checked before anything is sent: found only once the peer
    /// had answered, the shortfall ended the opening with an error packet, which also
    /// dropped the peer's session.
    pub(crate) async fn check_anchor_affordable(
        &self,
        amount_sat: u64,
    ) -> Result<(), NodeWalletError> {
        let outputs = self.store.spendable_outputs().await?;
        let spendable_sat = outputs.iter().map(|o| o.amount_sat).sum();
        let refused = |needed_sat| NodeWalletError::InsufficientFunds {
            asked_sat: amount_sat,
            needed_sat,
            spendable_sat,
        };
        if outputs.is_empty() {
            return Err(refused(amount_sat));
        }
        let inputs = self.inputs(outputs, None)?;
        // Placeholders of the real scripts' sizes: the anchor is a P2WSH 2-of-2, the
        // change a P2WPKH; only their sizes enter the fee.
        let anchor = TxOut {
            value: Amount::from_sat(amount_sat),
            script_pubkey: ScriptBuf::new_p2wsh(&bitcoin::WScriptHash::all_zeros()),
        };
        let change = ScriptBuf::new_p2wpkh(&bitcoin::WPubkeyHash::all_zeros());
        let rate = self.fee_rate().await;
        match wallet::build_transaction(&inputs, &[anchor], Some(&change), rate) {
            Ok(_) => Ok(()),
            Err(wallet::BuildError::InsufficientFunds { needed, .. }) => {
                Err(refused(needed.to_sat()))
            }
            Err(e) => Err(NodeWalletError::Funding(e.into())),
        }
    }

    /// Builds and signs the anchor from confirmed wallet outputs, reserving them.
    pub(crate) async fn fund_anchor(
        &self,
        channel_id: ChannelId,
        script_pubkey: ScriptBuf,
        amount: Amount,
    ) -> Result<(Transaction, u32), NodeWalletError> {
        let _guard = self.funding.lock().await;
        let outputs = self.store.spendable_outputs().await?;
        let fee_rate = self.fee_rate().await;
        // Enough for the anchor and a generous fee: stop adding inputs.
        let inputs = self.inputs(outputs, Some(amount + Amount::from_sat(50_000)))?;
        let change_index = self.store.next_index(MetaKey::NextChange).await?;
        let change_path = KeyPath {
            branch: wallet::CHANGE_BRANCH,
            index: change_index,
        };
        let change = self.keys.derive(change_path)?.address.script_pubkey();
        self.watch_script(change.clone(), change_path);
        let payment = [TxOut {
            value: amount,
            script_pubkey,
        }];
        // Anti-fee-sniping nLockTime at the tip, as Core's wallet does.
        let built = match self.chain.tip().await {
            Ok(tip) => {
                self.keys
                    .build_signed_at(&inputs, &payment, Some(&change), fee_rate, tip.height)?
            }
            Err(_) => self
                .keys
                .build_signed(&inputs, &payment, Some(&change), fee_rate)?,
        };
        let txid = built.tx.compute_txid();
        let spent: Vec<OutPoint> = inputs.iter().map(|i| i.outpoint).collect();
        self.store.spend_outputs(&spent, &txid).await?;
        tracing::info!(channel = %channel_id, anchor = %txid, fee = %built.fee, "anchor built");
        Ok((built.tx, 0))
    }
}
