//! A migration request's transfer options, parsed.

use std::time::Duration;

use roam_transfer::{AdaptConfig, Codec, EncoderConfig, Mode as XMode, ModeSelect};
use roam_wire::Mode;

use crate::types::{MigrateRequest, TransferOptions};

/// A migration request, parsed.
pub(super) struct Plan {
    pub req: MigrateRequest,
    pub mode: Mode,
    pub select: ModeSelect,
    pub rate: Option<roam_link::Rate>,
}

impl Plan {
    /// Parse a request, or say what is wrong with it.
    pub(super) fn parse(req: MigrateRequest) -> Result<Plan, String> {
        let mode = Mode::parse(&req.mode).ok_or_else(|| {
            format!(
                "unknown mode `{}`: use stop-and-copy, pre-copy or post-copy",
                req.mode
            )
        })?;
        let select = parse_codec(&req.transfer)?;
        parse_final_round(&req.transfer)?;
        let rate = match &req.transfer.bandwidth {
            Some(b) => Some(roam_link::parse_rate(b).map_err(|e| e.to_string())?),
            None => None,
        };
        Ok(Plan {
            req,
            mode,
            select,
            rate,
        })
    }

    /// The transfer pipeline's settings for this migration.
    pub(super) fn encoder_config(&self) -> EncoderConfig {
        let mut c = EncoderConfig {
            mode: self.select.clone(),
            shuffle_seed: self.req.transfer.randomize.then_some(0x5eed),
            ..EncoderConfig::default()
        };
        if self.mode == Mode::PostCopy {
            // Demand requests must not queue behind a deep pipeline.
            c.max_in_flight = 64;
            c.output_batches = 1;
            c.batch_bytes = 64 * 1024;
            c.flush_after = Duration::from_millis(2);
        }
        c
    }
}

/// How pre-copy's final round is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FinalRound {
    /// Through the transfer pipeline, like every other round.
    Pipeline,
    /// On one thread, straight into the connection, with this codec.
    Direct(Codec),
}

/// Parse `final_round` (`lz4` by default).
pub(super) fn parse_final_round(t: &TransferOptions) -> Result<FinalRound, String> {
    Ok(match t.final_round.as_deref() {
        None | Some("lz4") => FinalRound::Direct(Codec::Lz4),
        Some("pipeline") => FinalRound::Pipeline,
        Some("none") => FinalRound::Direct(Codec::None),
        Some(z) if z.starts_with("zstd") => match z[4..].parse::<u8>() {
            Ok(level) if (1..=19).contains(&level) => FinalRound::Direct(Codec::Zstd(level)),
            _ => {
                return Err(format!(
                    "bad zstd level in final round `{z}`: use zstd1 ... zstd19"
                ))
            }
        },
        Some(other) => {
            return Err(format!(
                "unknown final round `{other}`: use lz4, none, zstd1 ... zstd19 or pipeline"
            ))
        }
    })
}

/// Parse `codec`/`delta` into the pipeline's mode selection.
pub(super) fn parse_codec(t: &TransferOptions) -> Result<ModeSelect, String> {
    let delta = t.delta.unwrap_or(true);
    let codec = match t.codec.as_deref() {
        None | Some("adaptive") => return Ok(ModeSelect::Adaptive(AdaptConfig::default())),
        Some("none") => Codec::None,
        Some("lz4") => Codec::Lz4,
        Some(z) if z.starts_with("zstd") => {
            let level: u8 = z[4..]
                .parse()
                .map_err(|_| format!("bad zstd level in `{z}`"))?;
            if !(1..=19).contains(&level) {
                return Err(format!("zstd level {level} is outside 1..=19"));
            }
            Codec::Zstd(level)
        }
        Some(other) => {
            return Err(format!(
                "unknown codec `{other}`: use adaptive, none, lz4 or zstd1 ... zstd19"
            ))
        }
    };
    Ok(ModeSelect::Static(XMode::new(delta, codec)))
}
