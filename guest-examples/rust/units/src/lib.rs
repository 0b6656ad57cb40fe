//! A unit converter, written as any component would be: its world
//! (`wit/units.wit`) exports two functions and knows nothing of Airlock.
//! Airlock offers both as tools, with schemas from their WIT types.

wit_bindgen::generate!({ path: "wit", world: "units" });

struct Units;

/// What a unit measures, and how to reach its base unit (metre, kilogram,
/// kelvin, litre): base = value * scale + offset.
fn quantity(unit: Unit) -> (&'static str, f64, f64) {
    match unit {
        Unit::Metre => ("length", 1.0, 0.0),
        Unit::Kilometre => ("length", 1000.0, 0.0),
        Unit::Centimetre => ("length", 0.01, 0.0),
        Unit::Millimetre => ("length", 0.001, 0.0),
        Unit::Mile => ("length", 1609.344, 0.0),
        Unit::Yard => ("length", 0.9144, 0.0),
        Unit::Foot => ("length", 0.3048, 0.0),
        Unit::Inch => ("length", 0.0254, 0.0),
        Unit::Kilogram => ("mass", 1.0, 0.0),
        Unit::Gram => ("mass", 0.001, 0.0),
        Unit::Pound => ("mass", 0.453_592_37, 0.0),
        Unit::Ounce => ("mass", 0.028_349_523_125, 0.0),
        Unit::Celsius => ("temperature", 1.0, 273.15),
        Unit::Fahrenheit => ("temperature", 5.0 / 9.0, 273.15 - 32.0 * 5.0 / 9.0),
        Unit::Kelvin => ("temperature", 1.0, 0.0),
        Unit::Litre => ("volume", 1.0, 0.0),
        Unit::Millilitre => ("volume", 0.001, 0.0),
        Unit::UsGallon => ("volume", 3.785_411_784, 0.0),
    }
}

impl Guest for Units {
    fn convert(value: f64, from: Unit, to: Unit) -> Result<f64, String> {
        let (from_kind, from_scale, from_offset) = quantity(from);
        let (to_kind, to_scale, to_offset) = quantity(to);
        if from_kind != to_kind {
            return Err(format!("cannot convert {from_kind} to {to_kind}"));
        }
        let base = value * from_scale + from_offset;
        Ok((base - to_offset) / to_scale)
    }

    fn units() -> Vec<Unit> {
        use Unit::*;
        vec![
            Metre, Kilometre, Centimetre, Millimetre, Mile, Yard, Foot, Inch, Kilogram, Gram,
            Pound, Ounce, Celsius, Fahrenheit, Kelvin, Litre, Millilitre, UsGallon,
        ]
    }
}

export!(Units);
