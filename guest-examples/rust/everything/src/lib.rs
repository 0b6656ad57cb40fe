//! The tools the official MCP conformance suite calls (its server
//! scenarios name them), as far as Airlock's contract lets a tool answer
//! them; `make test` runs the suite against `airlock mcp` serving this
//! component (tests/all/mcp_conformance.rs).
//!
//! - `test_simple_text {}`: a text result.
//! - `test_error_handling {}`: a failed call.
//! - `test_tool_with_logging {}`: three log records as it runs (a client
//!   that set a log level hears them as they are made).
//! - `test_tool_with_progress {}`: progress 0, 50 and 100 of 100 (a
//!   client that sent a progress token hears them as they are made).
//! - `test_image_content {}`, `test_audio_content {}`,
//!   `test_embedded_resource {}`, `test_multiple_content_types {}`: an
//!   image (a 1×1 PNG), a sound (a short WAV), a resource
//!   (`test://embedded-resource`: the policy allows the `test` scheme), and
//!   text, an image and a resource, shown beside the result.
//! - `test_elicitation {message}`, `test_elicitation_sep1034_defaults {}`,
//!   `test_elicitation_sep1330_enums {}`: ask the person a question (a
//!   name and email; every primitive with a default; every kind of enum)
//!   and say how they answered. The policy must say `ask = true`.
//! - `test_sampling {prompt}`: asks the model to answer `prompt` and says
//!   what it said. The policy must say `sample = {}`.
//! - `sketch {steps}`: reports progress `steps` times, then shows a
//!   checkerboard (a PNG): the same tool as guest-examples/python/picture
//!   and guest-examples/js/picture.
//! - `large_image {kib}`, `large_text {kib}`, `chatty {n}`: for `make
//!   bench` (§18): a PNG-headed image of `kib` KiB beside a result of `kib`
//!   KiB of JSON text; `n` progress reports and `n` log records.
//! - `greet {}`: asks its person for a name and the model for a greeting,
//!   and appends both to deps `greetings` (an answer it does not get is
//!   recorded as such). The policy must say `ask = true` and `sample = {}`.
//! - `set_watched {text}`: writes deps `watched`, what
//!   `test://watched-resource` reads (a subscriber hears of the change).
//!
//! Resources: `test://static-text`, `test://static-binary` (the PNG),
//! `test://watched-resource` (deps `watched`), and the template
//! `test://template/{id}/data` (`id` completes from the ids in deps
//! `ids`, or `123` when there are none). Prompts: `test_simple_prompt`,
//! `test_prompt_with_arguments {arg1, arg2}` (`arg1` completes),
//! `test_prompt_with_embedded_resource {resourceUri}`,
//! `test_prompt_with_image`.

use std::time::Duration;

use airlock_guest::{
    Answer, Block, Contents, Context, EmbeddedResource, LogLevel, Media, Output, Prompt,
    PromptArgument, PromptMessage, PromptSpec, ReadError, ResourceBody, ResourceRequest,
    ResourceSpec, Said, Speaker, Spec, Tool, ToolError, Updates, Value, json,
};

/// How long the logging and progress tools wait between reports, so that
/// a client sees them arrive while the call runs.
const PAUSE: Duration = Duration::from_millis(50);

struct Everything;

/// A 1×1 red PNG.
const PNG: &[u8] = &[
    0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A, 0x00, 0x00, 0x00, 0x0D, 0x49, 0x48, 0x44, 0x52,
    0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x08, 0x02, 0x00, 0x00, 0x00, 0x90, 0x77, 0x53,
    0xDE, 0x00, 0x00, 0x00, 0x0C, 0x49, 0x44, 0x41, 0x54, 0x08, 0xD7, 0x63, 0xF8, 0xCF, 0xC0, 0x00,
    0x00, 0x03, 0x01, 0x01, 0x00, 0x18, 0xDD, 0x8D, 0xB0, 0x00, 0x00, 0x00, 0x00, 0x49, 0x45, 0x4E,
    0x44, 0xAE, 0x42, 0x60, 0x82,
];

/// An 8×8 checkerboard, as a PNG (what `sketch` shows, in every language).
const CHECKERBOARD: &[u8] = &[
    0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A, 0x00, 0x00, 0x00, 0x0D, 0x49, 0x48, 0x44, 0x52,
    0x00, 0x00, 0x00, 0x08, 0x00, 0x00, 0x00, 0x08, 0x08, 0x02, 0x00, 0x00, 0x00, 0x4B, 0x6D, 0x29,
    0xDC, 0x00, 0x00, 0x00, 0x1D, 0x49, 0x44, 0x41, 0x54, 0x78, 0xDA, 0x63, 0x78, 0xE1, 0xA5, 0x0E,
    0x44, 0xFF, 0xC1, 0x00, 0x99, 0xCD, 0x80, 0x53, 0x02, 0x53, 0x08, 0xC2, 0xC6, 0x2D, 0x41, 0x07,
    0x3B, 0x00, 0x4F, 0x12, 0x8A, 0xC1, 0x4D, 0x30, 0xA4, 0x1C, 0x00, 0x00, 0x00, 0x00, 0x49, 0x45,
    0x4E, 0x44, 0xAE, 0x42, 0x60, 0x82,
];

/// A WAV of 8 silent 8-bit samples at 8 kHz.
fn wav() -> Vec<u8> {
    let samples = [0x80u8; 8];
    let mut wav = Vec::new();
    wav.extend_from_slice(b"RIFF");
    wav.extend_from_slice(&(36 + samples.len() as u32).to_le_bytes());
    wav.extend_from_slice(b"WAVEfmt ");
    wav.extend_from_slice(&16u32.to_le_bytes());
    wav.extend_from_slice(&1u16.to_le_bytes()); // PCM
    wav.extend_from_slice(&1u16.to_le_bytes()); // mono
    wav.extend_from_slice(&8000u32.to_le_bytes());
    wav.extend_from_slice(&8000u32.to_le_bytes());
    wav.extend_from_slice(&1u16.to_le_bytes());
    wav.extend_from_slice(&8u16.to_le_bytes());
    wav.extend_from_slice(b"data");
    wav.extend_from_slice(&(samples.len() as u32).to_le_bytes());
    wav.extend_from_slice(&samples);
    wav
}

/// How the person answered, as the suite's tools say it.
fn answered(answer: Answer) -> Output {
    let (action, content) = match answer {
        Answer::Accept(content) => ("accept", content),
        Answer::Decline => ("decline", "{}".to_owned()),
        Answer::Cancel => ("cancel", "{}".to_owned()),
        Answer::Unavailable(why) => ("unavailable", json!(why).to_string()),
    };
    Output::new(json!(format!(
        "Elicitation completed: action={action}, content={content}"
    )))
}

fn image() -> Block {
    Block::Image(Media {
        data: PNG.to_vec(),
        mime_type: "image/png".into(),
    })
}

fn resource() -> Block {
    Block::Embedded(EmbeddedResource {
        uri: "test://embedded-resource".into(),
        mime_type: Some("text/plain".into()),
        body: ResourceBody::Text("This is an embedded resource content.".into()),
    })
}

fn no_arguments() -> Value {
    json!({"type": "object", "properties": {}, "additionalProperties": false})
}

impl Tool for Everything {
    fn describe() -> Vec<Spec> {
        vec![
            Spec::new(
                "test_simple_text",
                "Returns a simple text response.",
                no_arguments(),
            ),
            Spec::new(
                "test_error_handling",
                "Always fails, with a message saying so.",
                no_arguments(),
            ),
            Spec::new(
                "test_tool_with_logging",
                "Logs three messages while it runs.",
                no_arguments(),
            ),
            Spec::new(
                "test_tool_with_progress",
                "Reports progress 0, 50 and 100 of 100 while it runs.",
                no_arguments(),
            ),
            Spec::new(
                "test_elicitation",
                "Asks the user for their name and email.",
                json!({
                    "type": "object",
                    "properties": {"message": {"type": "string"}},
                    "required": ["message"]
                }),
            ),
            Spec::new(
                "test_elicitation_sep1034_defaults",
                "Asks a question whose every field has a default.",
                no_arguments(),
            ),
            Spec::new(
                "test_elicitation_sep1330_enums",
                "Asks a question with every kind of enum.",
                no_arguments(),
            ),
            Spec::new(
                "test_sampling",
                "Asks the model to answer a prompt.",
                json!({
                    "type": "object",
                    "properties": {"prompt": {"type": "string"}},
                    "required": ["prompt"]
                }),
            ),
            Spec::new("test_image_content", "Shows an image.", no_arguments()),
            Spec::new("test_audio_content", "Plays a short sound.", no_arguments()),
            Spec::new(
                "test_embedded_resource",
                "Shows a resource, contents included.",
                no_arguments(),
            ),
            Spec::new(
                "test_multiple_content_types",
                "Shows text, an image and a resource.",
                no_arguments(),
            ),
            Spec::new(
                "sketch",
                "Draw a checkerboard in `steps` strokes, reporting each, and show it.",
                json!({
                    "type": "object",
                    "properties": {"steps": {"type": "integer", "minimum": 1, "maximum": 10}},
                    "required": ["steps"],
                    "additionalProperties": false
                }),
            ),
            Spec::new(
                "large_image",
                "Shows an image of `kib` KiB (for benchmarks).",
                json!({
                    "type": "object",
                    "properties": {"kib": {"type": "integer", "minimum": 1, "maximum": 512}},
                    "required": ["kib"]
                }),
            ),
            Spec::new(
                "large_text",
                "Returns `kib` KiB of text (for benchmarks).",
                json!({
                    "type": "object",
                    "properties": {"kib": {"type": "integer", "minimum": 1, "maximum": 512}},
                    "required": ["kib"]
                }),
            ),
            Spec::new(
                "chatty",
                "Reports progress `n` times and logs `n` records (for benchmarks).",
                json!({
                    "type": "object",
                    "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 500}},
                    "required": ["n"]
                }),
            ),
            Spec::new(
                "greet",
                "Asks for a name and greets it, remembering both.",
                no_arguments(),
            ),
            Spec::new(
                "set_watched",
                "Sets the text test://watched-resource shows.",
                json!({
                    "type": "object",
                    "properties": {"text": {"type": "string"}},
                    "required": ["text"]
                }),
            ),
        ]
    }

    fn call(_ctx: &Context, name: &str, args: &Value) -> Result<Output, ToolError> {
        match name {
            "test_simple_text" => Ok(Output::new(json!(
                "This is a simple text response for testing."
            ))),
            "test_error_handling" => Err(ToolError::Failed(
                "This tool intentionally returns an error for testing".into(),
            )),
            "test_tool_with_logging" => {
                let steps = [
                    "Tool execution started",
                    "Tool processing data",
                    "Tool execution completed",
                ];
                for (i, step) in steps.into_iter().enumerate() {
                    if i > 0 {
                        std::thread::sleep(PAUSE);
                    }
                    airlock_guest::log(LogLevel::Info, step);
                }
                Ok(Output::new(json!("Logged three messages.")))
            }
            "test_tool_with_progress" => {
                for (i, done) in [0.0, 50.0, 100.0].into_iter().enumerate() {
                    if i > 0 {
                        std::thread::sleep(PAUSE);
                    }
                    airlock_guest::progress(done, Some(100.0), Some(&format!("{done} of 100")));
                }
                Ok(Output::new(json!("Progress reported.")))
            }
            "test_elicitation" => {
                let message = airlock_guest::str_arg(args, "message")?;
                let schema = json!({
                    "type": "object",
                    "properties": {
                        "username": {"type": "string", "description": "Your name"},
                        "email": {"type": "string", "description": "Your email address"}
                    },
                    "required": ["username", "email"]
                });
                Ok(answered(airlock_guest::ask_user(message, &schema)))
            }
            "test_elicitation_sep1034_defaults" => {
                let schema = json!({
                    "type": "object",
                    "properties": {
                        "name": {"type": "string", "default": "John Doe"},
                        "age": {"type": "integer", "default": 30},
                        "score": {"type": "number", "default": 95.5},
                        "status": {"type": "string", "enum": ["active", "inactive", "pending"], "default": "active"},
                        "verified": {"type": "boolean", "default": true}
                    }
                });
                Ok(answered(airlock_guest::ask_user(
                    "Please review your details",
                    &schema,
                )))
            }
            "test_elicitation_sep1330_enums" => {
                let schema = json!({
                    "type": "object",
                    "properties": {
                        "untitledSingle": {"type": "string", "enum": ["option1", "option2", "option3"]},
                        "titledSingle": {"type": "string", "oneOf": [
                            {"const": "value1", "title": "First Option"},
                            {"const": "value2", "title": "Second Option"},
                            {"const": "value3", "title": "Third Option"}
                        ]},
                        "legacyEnum": {"type": "string", "enum": ["opt1", "opt2", "opt3"],
                            "enumNames": ["Option One", "Option Two", "Option Three"]},
                        "untitledMulti": {"type": "array", "items": {"type": "string", "enum": ["option1", "option2", "option3"]}},
                        "titledMulti": {"type": "array", "items": {"anyOf": [
                            {"const": "value1", "title": "First Choice"},
                            {"const": "value2", "title": "Second Choice"},
                            {"const": "value3", "title": "Third Choice"}
                        ]}}
                    }
                });
                Ok(answered(airlock_guest::ask_user(
                    "Pick some options",
                    &schema,
                )))
            }
            "test_sampling" => {
                let prompt = airlock_guest::str_arg(args, "prompt")?;
                let said = [Said {
                    speaker: Speaker::User,
                    text: prompt.to_owned(),
                }];
                match airlock_guest::ask_model(&said, None, 100) {
                    Ok(reply) => Ok(Output::new(json!(format!("LLM response: {}", reply.text)))),
                    Err(why) => Err(ToolError::Failed(format!(
                        "the model did not answer: {why}"
                    ))),
                }
            }
            "test_image_content" => {
                airlock_guest::show(image());
                Ok(Output::new(json!("A red pixel.")))
            }
            "test_audio_content" => {
                airlock_guest::show(Block::Audio(Media {
                    data: wav(),
                    mime_type: "audio/wav".into(),
                }));
                Ok(Output::new(json!("A moment of silence.")))
            }
            "test_embedded_resource" => {
                airlock_guest::show(resource());
                Ok(Output::new(json!("A resource.")))
            }
            "test_multiple_content_types" => {
                airlock_guest::show(Block::Text("Text, an image and a resource:".into()));
                airlock_guest::show(image());
                airlock_guest::show(resource());
                Ok(Output::new(json!("Three blocks.")))
            }
            "sketch" => {
                let steps = args.get("steps").and_then(Value::as_u64).unwrap_or(1);
                for stroke in 1..=steps {
                    airlock_guest::progress(
                        stroke as f64,
                        Some(steps as f64),
                        Some(&format!("stroke {stroke} of {steps}")),
                    );
                }
                airlock_guest::show(Block::Image(Media {
                    data: CHECKERBOARD.to_vec(),
                    mime_type: "image/png".into(),
                }));
                Ok(Output::new(json!({
                    "steps": steps,
                    "shown": "image/png",
                    "bytes": CHECKERBOARD.len()
                })))
            }
            "large_image" => {
                let kib = args.get("kib").and_then(Value::as_u64).unwrap_or(1) as usize;
                let mut data = CHECKERBOARD.to_vec();
                data.resize(kib << 10, 0);
                airlock_guest::show(Block::Image(Media {
                    data,
                    mime_type: "image/png".into(),
                }));
                Ok(Output::new(json!({"kib": kib})))
            }
            "large_text" => {
                let kib = args.get("kib").and_then(Value::as_u64).unwrap_or(1) as usize;
                Ok(Output::new(json!("x".repeat(kib << 10))))
            }
            "chatty" => {
                let n = args.get("n").and_then(Value::as_u64).unwrap_or(0);
                for i in 1..=n {
                    airlock_guest::progress(i as f64, Some(n as f64), None);
                    airlock_guest::log(LogLevel::Info, &format!("step {i} of {n}"));
                }
                Ok(Output::new(json!({"reported": n})))
            }
            "greet" => {
                let schema = json!({
                    "type": "object",
                    "properties": {"name": {"type": "string"}},
                    "required": ["name"]
                });
                let name = match airlock_guest::ask_user("Whom shall I greet?", &schema) {
                    Answer::Accept(content) => content
                        .parse::<Value>()
                        .ok()
                        .and_then(|c| c.get("name").and_then(Value::as_str).map(str::to_owned))
                        .unwrap_or_default(),
                    other => return Ok(answered(other)),
                };
                let said = [Said {
                    speaker: Speaker::User,
                    text: format!("Write a one-line greeting for {name}."),
                }];
                let greeting = airlock_guest::ask_model(&said, None, 50)
                    .map(|reply| reply.text)
                    .unwrap_or_else(|why| format!("(no greeting: {why})"));
                let entry = json!({"name": name, "greeting": greeting});
                Ok(Output::new(entry.clone()).with(Updates::new().append("greetings", entry)))
            }
            "set_watched" => {
                let text = airlock_guest::str_arg(args, "text")?;
                Ok(Output::new(json!("set")).with(Updates::new().set("watched", text)))
            }
            other => Err(ToolError::InvalidArgs(format!("no tool {other}"))),
        }
    }

    fn resources() -> Vec<ResourceSpec> {
        let spec = |uri: &str, name: &str, description: &str, mime_type: &str| ResourceSpec {
            uri: uri.into(),
            name: name.into(),
            title: None,
            description: Some(description.into()),
            mime_type: Some(mime_type.into()),
        };
        vec![
            spec(
                "test://static-text",
                "static-text",
                "A text resource that never changes.",
                "text/plain",
            ),
            spec(
                "test://static-binary",
                "static-binary",
                "A binary resource: a 1×1 PNG.",
                "image/png",
            ),
            spec(
                "test://watched-resource",
                "watched-resource",
                "The text set_watched last wrote.",
                "text/plain",
            ),
            spec(
                "test://template/{id}/data",
                "template-data",
                "Data for the item `id`.",
                "application/json",
            ),
        ]
    }

    fn read(ctx: &Context, request: &ResourceRequest) -> Result<Vec<Contents>, ReadError> {
        let text = |text: String, mime_type: &str| Contents {
            uri: request.uri.clone(),
            mime_type: Some(mime_type.into()),
            body: ResourceBody::Text(text),
        };
        let contents = match (request.uri.as_str(), request.template.as_deref()) {
            ("test://static-text", None) => text(
                "This is the content of the static text resource.".into(),
                "text/plain",
            ),
            ("test://static-binary", None) => Contents {
                uri: request.uri.clone(),
                mime_type: Some("image/png".into()),
                body: ResourceBody::Blob(PNG.to_vec()),
            },
            ("test://watched-resource", None) => {
                let watched = ctx
                    .get("watched")
                    .map_err(|e| ReadError::Failed(format!("{e:?}")))?;
                let watched = watched
                    .as_ref()
                    .and_then(Value::as_str)
                    .unwrap_or("nothing yet");
                text(format!("Watched: {watched}"), "text/plain")
            }
            (_, Some("test://template/{id}/data")) => {
                let id = airlock_guest::arg(&request.variables, "id").unwrap_or_default();
                text(
                    json!({"id": id, "templateTest": true, "data": format!("Data for ID: {id}")})
                        .to_string(),
                    "application/json",
                )
            }
            _ => return Err(ReadError::NotFound),
        };
        Ok(vec![contents])
    }

    fn complete_resource(
        ctx: &Context,
        _template: &str,
        _variable: &str,
        value: &str,
        _resolved: &[(String, String)],
    ) -> Vec<String> {
        let ids = ctx.array("ids").unwrap_or_default();
        let ids: Vec<String> = if ids.is_empty() {
            vec!["123".into()]
        } else {
            ids.iter()
                .filter_map(|id| id.as_str().map(str::to_owned))
                .collect()
        };
        ids.into_iter().filter(|id| id.starts_with(value)).collect()
    }

    fn prompts() -> Vec<PromptSpec> {
        let argument = |name: &str, description: &str| PromptArgument {
            name: name.into(),
            description: Some(description.into()),
            required: true,
        };
        let prompt = |name: &str, description: &str, arguments| PromptSpec {
            name: name.into(),
            title: None,
            description: Some(description.into()),
            arguments,
        };
        vec![
            prompt("test_simple_prompt", "A prompt with no arguments.", vec![]),
            prompt(
                "test_prompt_with_arguments",
                "A prompt with two arguments.",
                vec![
                    argument("arg1", "First test argument"),
                    argument("arg2", "Second test argument"),
                ],
            ),
            prompt(
                "test_prompt_with_embedded_resource",
                "A prompt that embeds a resource.",
                vec![argument("resourceUri", "URI of the resource to embed")],
            ),
            prompt("test_prompt_with_image", "A prompt with an image.", vec![]),
        ]
    }

    fn prompt(
        _ctx: &Context,
        name: &str,
        arguments: &[(String, String)],
    ) -> Result<Prompt, String> {
        let user = |content| PromptMessage {
            speaker: Speaker::User,
            content,
        };
        let text = |text: String| user(Block::Text(text));
        let arg = |name| airlock_guest::arg(arguments, name).unwrap_or_default();
        let messages = match name {
            "test_simple_prompt" => vec![text("This is a simple prompt for testing.".into())],
            "test_prompt_with_arguments" => vec![text(format!(
                "Prompt with arguments: arg1='{}', arg2='{}'",
                arg("arg1"),
                arg("arg2")
            ))],
            "test_prompt_with_embedded_resource" => vec![
                user(Block::Embedded(EmbeddedResource {
                    uri: arg("resourceUri").into(),
                    mime_type: Some("text/plain".into()),
                    body: ResourceBody::Text("Embedded resource content for testing.".into()),
                })),
                text("Please process the embedded resource above.".into()),
            ],
            "test_prompt_with_image" => vec![
                user(image()),
                text("Please analyze the image above.".into()),
            ],
            other => return Err(format!("no prompt {other:?}")),
        };
        Ok(Prompt {
            description: None,
            messages,
        })
    }

    fn complete_prompt(
        _ctx: &Context,
        _name: &str,
        argument: &str,
        value: &str,
        _resolved: &[(String, String)],
    ) -> Vec<String> {
        let known: &[&str] = match argument {
            "arg1" => &["test", "testValue1", "other"],
            _ => &[],
        };
        known
            .iter()
            .filter(|v| v.starts_with(value))
            .map(|v| (*v).to_owned())
            .collect()
    }
}

airlock_guest::export_tool!(Everything);
