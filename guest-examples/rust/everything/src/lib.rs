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

use std::time::Duration;

use airlock_guest::{
    Answer, Block, Context, EmbeddedResource, LogLevel, Media, Output, ResourceBody, Said, Speaker,
    Spec, Tool, ToolError, Value, json,
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
            other => Err(ToolError::InvalidArgs(format!("no tool {other}"))),
        }
    }
}

airlock_guest::export_tool!(Everything);
