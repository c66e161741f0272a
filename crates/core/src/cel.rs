//! JSON values as CEL literals, for the admission policies and the conditions `defaulted`
//! writes beside its Rust rules.

use serde_json::Value;

/// `value` as a CEL literal.
pub(crate) fn cel_json(value: &Value) -> String {
    match value {
        Value::Null => "null".to_owned(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) if n.is_f64() => {
            let text = n.to_string();
            // A CEL double literal needs a dot or an exponent.
            if text.contains(['.', 'e', 'E']) {
                text
            } else {
                format!("{text}.0")
            }
        }
        Value::Number(n) => n.to_string(),
        Value::String(s) => cel_string(s),
        Value::Array(items) => cel_array(items.iter().map(cel_json)),
        Value::Object(fields) => cel_object(fields.iter().map(|(k, v)| (k.as_str(), cel_json(v)))),
    }
}

/// A CEL list. CEL checks that a list's items share a type; `dyn` lets JSON mix them.
pub(crate) fn cel_array(items: impl Iterator<Item = String>) -> String {
    let items: Vec<String> = items.map(|item| format!("dyn({item})")).collect();
    format!("[{}]", items.join(", "))
}

/// A CEL map, its values in `dyn` as list items are.
pub(crate) fn cel_object<'k>(fields: impl Iterator<Item = (&'k str, String)>) -> String {
    let fields: Vec<String> = fields.map(|(key, value)| cel_entry(key, &value)).collect();
    format!("{{{}}}", fields.join(", "))
}

/// One entry of a CEL map literal.
pub(crate) fn cel_entry(key: &str, value: &str) -> String {
    format!("{}: dyn({value})", cel_string(key))
}

/// A CEL list of string literals.
pub(crate) fn cel_list<'a>(items: impl Iterator<Item = &'a str>) -> String {
    format!("[{}]", items.map(cel_string).collect::<Vec<_>>().join(", "))
}

/// A CEL string literal. JSON's escapes are CEL escapes too, so whatever the text holds it
/// stays one string.
pub(crate) fn cel_string(text: &str) -> String {
    serde_json::to_string(text).unwrap_or_else(|_| "\"\"".to_owned())
}

/// CEL evaluated as the API server would, for the tests that hold a rule's CEL form against
/// its Rust form.
#[cfg(test)]
pub(crate) mod testing {
    use kube_cel::KubeCelExt as _;
    use kube_cel::cel;
    use serde_json::Value;

    /// `source` evaluated with the Kubernetes CEL libraries over `variables`, their integers
    /// `int`s ([`typed`]); panics, naming the expression, when it does not parse or evaluate.
    pub(crate) fn evaluate(source: &str, variables: &[(&str, &Value)]) -> cel::Value {
        let program = cel::parser::Parser::new()
            .enable_optional_syntax(true)
            .parse(source)
            .unwrap_or_else(|e| panic!("{source}: {e:?}"));
        let mut context = context();
        for (name, value) in variables {
            context.add_variable_from_value(*name, typed(value));
        }
        context
            .resolve(&program)
            .unwrap_or_else(|e| panic!("{source}: {e:?}"))
    }

    /// A context with the Kubernetes CEL libraries, and `dyn` (standard CEL, which the
    /// interpreter lacks) as what it is to a value already typed: the value itself.
    pub(crate) fn context() -> cel::Context<'static> {
        let mut context = cel::Context::default().with_all();
        context.add_function("dyn", dyn_);
        context
    }

    fn dyn_(cel::extractors::Arguments(args): cel::extractors::Arguments) -> cel::ResolveResult {
        Ok(args.first().cloned().unwrap_or(cel::Value::Null))
    }

    /// `value` as the API server's CEL sees an object's fields: its integers are `int`s.
    pub(crate) fn typed(value: &Value) -> cel::Value {
        match value {
            Value::Number(n) => n
                .as_i64()
                .map_or_else(|| cel::to_value(n).unwrap(), cel::Value::Int),
            Value::Array(items) => items.iter().map(typed).collect::<Vec<_>>().into(),
            Value::Object(fields) => fields
                .iter()
                .map(|(k, v)| (k.clone(), typed(v)))
                .collect::<std::collections::HashMap<_, _>>()
                .into(),
            other => cel::to_value(other).unwrap(),
        }
    }
}
