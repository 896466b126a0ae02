//! `images`, `images import`, `images rm`.

use anyhow::{Context, Result};
use hyper::Method;
use indicatif::{ProgressBar, ProgressStyle};
use sandtree_api::*;

use super::Ctx;
use crate::cli::ImagesCommand;
use crate::cli::client::{RemoteError, enc};
use crate::cli::output::{ago, print_json, table};
use crate::units::human_bytes;

pub async fn images(ctx: &Ctx, action: Option<ImagesCommand>) -> Result<i32> {
    match action.unwrap_or(ImagesCommand::Ls) {
        ImagesCommand::Ls => {
            let l: ImageList = ctx.get(Method::GET, "/v1/images").await?;
            if !ctx.json {
                let rows: Vec<Vec<String>> = l
                    .images
                    .iter()
                    .map(|i| {
                        vec![
                            i.name.clone(),
                            i.kind.clone(),
                            human_bytes(i.size_bytes),
                            ago(&i.created_at),
                            i.source.clone().unwrap_or_else(|| "-".into()),
                        ]
                    })
                    .collect();
                print!("{}", table(&["NAME", "KIND", "SIZE", "CREATED", "SOURCE"], &rows));
            }
            Ok(0)
        }
        ImagesCommand::Rm { name } => {
            let _: serde_json::Value = ctx.get(Method::DELETE, &format!("/v1/images/{}", enc(&name))).await?;
            if !ctx.json {
                println!("{name}");
            }
            Ok(0)
        }
        ImagesCommand::Import { name, path } => {
            // The daemon reads the path on its host: send it absolute.
            let source = std::fs::canonicalize(&path).with_context(|| format!("{}", path.display()))?;
            let req = ImportImageRequest { name, source: source.display().to_string() };
            let bar = if ctx.json { ProgressBar::hidden() } else { ProgressBar::new(0) };
            bar.set_style(
                ProgressStyle::with_template("{msg:>10} [{bar:40}] {bytes}/{total_bytes} {prefix}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar())
                    .progress_chars("=> "),
            );
            let mut result: Option<Result<ImageInfo, ApiError>> = None;
            let json = ctx.json;
            ctx.client
                .stream(Method::POST, "/v1/images", Some(&req), |ev: ImportEvent| {
                    if json {
                        print_json(&serde_json::to_value(&ev)?);
                    }
                    match ev {
                        ImportEvent::Progress { phase, done_bytes, total_bytes, files } => {
                            bar.set_length(total_bytes.max(done_bytes));
                            bar.set_position(done_bytes);
                            bar.set_message(phase);
                            bar.set_prefix(format!("{files} files"));
                        }
                        ImportEvent::Done(i) => result = Some(Ok(i)),
                        ImportEvent::Error(e) => result = Some(Err(e)),
                    }
                    Ok(())
                })
                .await?;
            bar.finish_and_clear();
            match result {
                Some(Ok(i)) => {
                    if !json {
                        println!("{} ({})", i.name, human_bytes(i.size_bytes));
                    }
                    Ok(0)
                }
                Some(Err(e)) => Err(RemoteError(e).into()),
                None => anyhow::bail!("the daemon's import stream ended without a result"),
            }
        }
    }
}
