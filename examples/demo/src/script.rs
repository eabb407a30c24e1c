//! The demo's script: what the "model" asks for, round by round, and the two
//! simulated tools.
//!
//! | round | calls | note |
//! |---|---|---|
//! | 0 | `send_email` + `pay` | two parallel calls, begun in one transaction |
//! | 1 | `send_email` | |
//! | 2 | `pay` | requires approval; the demo approves, binding digest and preview |
//! | 3 | — | read-back: the conversation is reloaded and every earlier call is asked again; all must replay |
//!
//! The argument values below are made up but look personal on purpose: the
//! tests check that neither the demo output nor `inspect` ever prints them.

use serde_json::Value;
use toolledger::ledger::CallSpec;
use toolledger::model::{ExecutionId, ExecutionIdParts, OperationId, ToolCall};

use crate::remote::Dedupe;
use crate::{CliError, CliResult};

/// The operation every demo run works in.
pub const OPERATION: &str = "demo_op_1";

/// The version of both demo tools.
pub const TOOL_VERSION: u32 = 1;

/// A simulated side-effecting tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tool {
    /// Its name, as the model calls it.
    pub name: &'static str,
    /// Prefix of the remote's ids for its effects.
    pub id_prefix: &'static str,
    /// How its downstream treats a repeated reference.
    pub dedupe: Dedupe,
}

/// The mail service: honours idempotency keys.
pub const SEND_EMAIL: Tool = Tool {
    name: "send_email",
    id_prefix: "msg",
    dedupe: Dedupe::ByReference,
};

/// The payment provider: no idempotency keys, lookup by reference only.
pub const PAY: Tool = Tool {
    name: "pay",
    id_prefix: "pay",
    dedupe: Dedupe::Never,
};

/// The tool called `name`.
///
/// # Errors
/// [`CliError::Other`] for a tool the demo does not know (a ledger written by
/// something else).
pub fn tool(name: &str) -> CliResult<Tool> {
    [SEND_EMAIL, PAY]
        .into_iter()
        .find(|t| t.name == name)
        .ok_or_else(|| CliError::Other(format!("the demo has no tool named `{name}`")))
}

impl Tool {
    /// The result the model is given for the effect `external_id`. A pure
    /// function of the remote's record, so a result rebuilt by
    /// reconciliation is byte for byte the one a normal run would commit.
    pub fn result_json(&self, external_id: &str) -> String {
        let value = match self.dedupe {
            Dedupe::ByReference => serde_json::json!({"message_id": external_id, "status": "sent"}),
            Dedupe::Never => serde_json::json!({"payment_id": external_id, "status": "paid"}),
        };
        value.to_string()
    }
}

/// One call the "model" asks for.
#[derive(Debug, Clone, Copy)]
pub struct ScriptedCall {
    /// The round (model response) it belongs to.
    pub round: u32,
    /// The provider call id.
    pub call_id: &'static str,
    /// The tool.
    pub tool: Tool,
    /// Position within the round.
    pub position: u32,
    /// The arguments as the model wrote them.
    pub arguments: &'static str,
    /// Whether a human must approve it first.
    pub requires_approval: bool,
}

/// Every side-effecting call of the script, in order.
pub const CALLS: [ScriptedCall; 4] = [
    ScriptedCall {
        round: 0,
        call_id: "call_r0_email",
        tool: SEND_EMAIL,
        position: 0,
        arguments: r#"{"to":"ada.lovelace@example.com","subject":"Quarterly report","body":"Hi Ada, the Q3 numbers are attached."}"#,
        requires_approval: false,
    },
    ScriptedCall {
        round: 0,
        call_id: "call_r0_pay",
        tool: PAY,
        position: 1,
        arguments: r#"{"amount_cents":4200,"currency":"EUR","to":"IBAN DE44 5001 0517 5407 3249 31"}"#,
        requires_approval: false,
    },
    ScriptedCall {
        round: 1,
        call_id: "call_r1_email",
        tool: SEND_EMAIL,
        position: 0,
        arguments: r#"{"to":"grace.hopper@example.net","subject":"Invoice settled","body":"Dear Grace, invoice 7731 is paid in full."}"#,
        requires_approval: false,
    },
    ScriptedCall {
        round: 2,
        call_id: "call_r2_pay",
        tool: PAY,
        position: 0,
        arguments: r#"{"amount_cents":1250,"currency":"EUR","to":"IBAN FR76 3000 6000 0112 3456 7890 189"}"#,
        requires_approval: true,
    },
];

/// The rounds that ask for new work (round 3, the read-back, asks again for
/// everything above).
pub const WORK_ROUNDS: [u32; 3] = [0, 1, 2];

/// The round number of the read-back.
pub const READ_BACK_ROUND: u32 = 3;

impl ScriptedCall {
    /// The call as the ledger's `begin` takes it.
    pub fn spec(&self) -> CallSpec {
        let mut call = ToolCall::custom(self.call_id, self.tool.name, self.arguments);
        call.position = self.position;
        let spec = CallSpec::new(call, TOOL_VERSION);
        if self.requires_approval {
            spec.with_approval()
        } else {
            spec
        }
    }

    /// The execution id the ledger derives for this call in `op`.
    ///
    /// # Errors
    /// Id errors (none for the fixed script).
    pub fn execution_id(&self, op: &OperationId) -> CliResult<ExecutionId> {
        Ok(ExecutionId::derive(&ExecutionIdParts {
            operation: op,
            round: self.round,
            call_id: self.call_id,
            tool_name: self.tool.name,
            tool_version: TOOL_VERSION,
        })?)
    }
}

/// The calls of one round.
pub fn round(index: u32) -> Vec<ScriptedCall> {
    CALLS.into_iter().filter(|c| c.round == index).collect()
}

/// What the approver is shown for a payment: amount and target, e.g.
/// `{"amount":"12.50 EUR","to":"…"}`. Built from the recorded (canonical)
/// arguments, stored with the approval, never printed.
///
/// # Errors
/// [`CliError::Other`] when the arguments are not a payment.
pub fn payment_preview(args_json: &str) -> CliResult<String> {
    let bad = || CliError::Other("the payment arguments have an unexpected shape".into());
    let args: Value = serde_json::from_str(args_json).map_err(|_| bad())?;
    let cents = args
        .get("amount_cents")
        .and_then(Value::as_u64)
        .ok_or_else(bad)?;
    let currency = args
        .get("currency")
        .and_then(Value::as_str)
        .ok_or_else(bad)?;
    let to = args.get("to").and_then(Value::as_str).ok_or_else(bad)?;
    let amount = format!("{}.{:02} {currency}", cents / 100, cents % 100);
    Ok(serde_json::json!({"amount": amount, "to": to}).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preview_formats_the_amount() {
        let p = payment_preview(CALLS[3].arguments).unwrap();
        let v: Value = serde_json::from_str(&p).unwrap();
        assert_eq!(v["amount"], "12.50 EUR");
        assert!(v["to"].as_str().unwrap().starts_with("IBAN FR76"));
    }

    #[test]
    fn results_depend_only_on_the_effect() {
        assert_eq!(PAY.result_json("pay_0001"), PAY.result_json("pay_0001"));
        assert_ne!(
            PAY.result_json("pay_0001"),
            SEND_EMAIL.result_json("pay_0001")
        );
    }

    #[test]
    fn rounds_partition_the_calls() {
        let total: usize = WORK_ROUNDS.iter().map(|r| round(*r).len()).sum();
        assert_eq!(total, CALLS.len());
        assert!(round(READ_BACK_ROUND).is_empty());
    }
}
