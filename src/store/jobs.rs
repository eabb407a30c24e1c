//! Background work attached to an execution: the `jobs` table (a
//! downstream's long-running job and its state), `webhook_events` (each
//! delivered event recorded once) and `batch_items` (the items of an
//! independent batch, each with its own result).

use rusqlite::{params, OptionalExtension};

use super::codec::{unseal, unseal_some};
use super::crypt::{Col, Row};
use super::dao::Dao;
use super::error::Result;
use crate::model::text::{bounded, MAX_LABEL_BYTES};
use crate::model::{DownstreamKey, ExecutionId};

impl Dao<'_> {
    /// Records the completion of one item of an independent batch.
    /// Returns false if the item was already recorded (nothing changes).
    ///
    /// # Errors
    /// Storage errors.
    pub fn insert_batch_item(
        &self,
        id: &ExecutionId,
        index: u32,
        item_key: &DownstreamKey,
        result_json: &str,
        external_id: Option<&str>,
        now_ms: i64,
    ) -> Result<bool> {
        let row = Row::with(id.as_str(), i64::from(index));
        let result = self.seal(Col::ItemResult, row, Some(result_json))?;
        let external = self.seal(Col::ItemExternalId, row, external_id)?;
        let changed = self
            .tx
            .prepare_cached(
                "INSERT INTO batch_items (execution_id, item_index, item_key, result_json,
                    external_id, committed_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                 ON CONFLICT(execution_id, item_index) DO NOTHING",
            )?
            .execute(params![id, index, item_key, result, external, now_ms])?;
        Ok(changed == 1)
    }

    /// True when some item of the batch `id` committed.
    ///
    /// # Errors
    /// Storage errors.
    pub fn has_batch_items(&self, id: &ExecutionId) -> Result<bool> {
        Ok(self
            .tx
            .prepare_cached("SELECT EXISTS (SELECT 1 FROM batch_items WHERE execution_id = ?1)")?
            .query_row([id], |r| r.get(0))?)
    }

    /// The completed items of a batch: `(index, result JSON, external id)`.
    ///
    /// # Errors
    /// Storage errors.
    pub fn batch_items(&self, id: &ExecutionId) -> Result<Vec<(u32, String, Option<String>)>> {
        let mut stmt = self.tx.prepare_cached(
            "SELECT item_index, result_json, external_id FROM batch_items
             WHERE execution_id = ?1 ORDER BY item_index",
        )?;
        let rows = stmt.query_map([id], |r| {
            let index: u32 = r.get(0)?;
            let row = Row::with(id.as_str(), i64::from(index));
            Ok((
                index,
                unseal_some(self.keys, Col::ItemResult, row, r.get_ref(1)?)?,
                unseal(self.keys, Col::ItemExternalId, row, r.get_ref(2)?)?,
            ))
        })?;
        Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
    }

    /// Creates or updates the background job of an execution.
    ///
    /// # Errors
    /// Storage errors.
    pub fn upsert_job(
        &self,
        id: &ExecutionId,
        job_id: &str,
        state: &str,
        now_ms: i64,
    ) -> Result<()> {
        let job = self.seal(Col::JobId, Row::of(id.as_str()), Some(job_id))?;
        // A label is free text: stored bounded (model/text.rs).
        let state = bounded(state, MAX_LABEL_BYTES);
        self.tx
            .prepare_cached(
                "INSERT INTO jobs (execution_id, job_id, state, updated_ms) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT(execution_id) DO UPDATE SET state = excluded.state,
                    updated_ms = excluded.updated_ms",
            )?
            .execute(params![id, job, state, now_ms])?;
        Ok(())
    }

    /// Records the job a tool started: its id replaces whatever an update
    /// that arrived first stored (an event handled before the tool's
    /// `JobStarted` knew no job id).
    ///
    /// # Errors
    /// Storage errors.
    pub fn set_job(&self, id: &ExecutionId, job_id: &str, state: &str, now_ms: i64) -> Result<()> {
        let job = self.seal(Col::JobId, Row::of(id.as_str()), Some(job_id))?;
        // A label is free text: stored bounded (model/text.rs).
        let state = bounded(state, MAX_LABEL_BYTES);
        self.tx
            .prepare_cached(
                "INSERT INTO jobs (execution_id, job_id, state, updated_ms) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT(execution_id) DO UPDATE SET job_id = excluded.job_id,
                    state = excluded.state, updated_ms = excluded.updated_ms",
            )?
            .execute(params![id, job, state, now_ms])?;
        Ok(())
    }

    /// The background job of an execution: `(job id, state)`.
    ///
    /// # Errors
    /// Storage errors.
    pub fn job(&self, id: &ExecutionId) -> Result<Option<(String, String)>> {
        Ok(self
            .tx
            .prepare_cached("SELECT job_id, state FROM jobs WHERE execution_id = ?1")?
            .query_row([id], |r| {
                Ok((
                    unseal_some(self.keys, Col::JobId, Row::of(id.as_str()), r.get_ref(0)?)?,
                    r.get(1)?,
                ))
            })
            .optional()?)
    }

    /// The execution a processed webhook event was applied to.
    ///
    /// # Errors
    /// Storage errors.
    pub fn webhook_event_execution(&self, source: &str, event_id: &str) -> Result<Option<String>> {
        Ok(self
            .tx
            .prepare_cached(
                "SELECT execution_id FROM webhook_events WHERE source = ?1 AND event_id = ?2",
            )?
            .query_row(params![source, event_id], |r| r.get(0))
            .optional()?)
    }

    /// Records a webhook event; returns false when `(source, event_id)` was
    /// already processed.
    ///
    /// # Errors
    /// Storage errors.
    pub fn insert_webhook_event(
        &self,
        source: &str,
        event_id: &str,
        id: &ExecutionId,
        now_ms: i64,
    ) -> Result<bool> {
        let changed = self
            .tx
            .prepare_cached(
                "INSERT INTO webhook_events (source, event_id, execution_id, received_ms)
                 VALUES (?1, ?2, ?3, ?4) ON CONFLICT(source, event_id) DO NOTHING",
            )?
            .execute(params![source, event_id, id, now_ms])?;
        Ok(changed == 1)
    }
}
