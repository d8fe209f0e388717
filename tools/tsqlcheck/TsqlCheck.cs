// tsqlcheck: Microsoft's T-SQL parser (ScriptDom, TSql150Parser) and DacFx
// model validation (what SSDT and sqlpackage run at build time), for the
// static tests of mailq-db.  No SQL Server is needed.
//
// Built with Mono's mcs against the .NET Standard 2.0 assemblies of the PyPI
// wheel mssql-cli==1.0.0 (see tools/tsqlcheck/README.md and
// src/mailq_db/devtools/tsqlcheck.py, which downloads, builds and runs it).
//
// Usage (every command prints JSON lines on stdout, one object per line):
//   tsqlcheck.exe parse FILE...
//       {"kind":"parse","source":F,"batches":N,"errors":[{"number","line","column","message"}]}
//   tsqlcheck.exe preprocess FILE...
//       {"kind":"statement","source":F,"index":K,"type":T,"line":L,"text":S}   kept for the model
//       {"kind":"skipped","source":F,"type":T,"line":L,"why":W}                  left out of the model
//   tsqlcheck.exe model (Sql150|SqlAzure) FILE...
//       the preprocess records, then one record per DacFx validation message:
//       {"kind":"model","target":T,"number":71501,"prefix":"SQL","severity":"Error","message":M}
//       (DacFx's messages carry no file or line: the message names the element)
//       and {"kind":"summary","target":T,"files":N,"statements":N,"objects":N,"seconds":S}
//
// Model preprocessing.  DacFx models object definitions, not deployment
// scripts, so every file is parsed with ScriptDom and reduced to the
// statements that define something:
//   * IF <guard> BEGIN ... END: the THEN branch is unwrapped (recursively);
//     the ELSE branch is skipped: in this project it adopts an object that
//     already exists (ALTER TABLE ... ADD of columns the THEN branch creates),
//     which would define those columns twice.
//   * CREATE OR ALTER is given as CREATE: the two words OR ALTER are blanked
//     with spaces, so every offset, line and column stays the file's own.
//   * statements that define nothing (DML, THROW, DECLARE, SET, PRINT, EXEC,
//     RETURN, ...) are skipped, each with a "skipped" record the tests read.
// Each kept statement is added as its own source (so one statement never
// replaces another), as the file's text with everything outside the statement
// blanked (newlines kept), so positions inside it stay the file's.
// TSqlModel.AddOrUpdateObjects(string, sourceName, options): "If any objects
// were previously added with the same sourceName these will be completely
// replaced ... The script should consist of valid TSql DDL statements."
// (learn.microsoft.com/dotnet/api/microsoft.sqlserver.dac.model.tsqlmodel.addorupdateobjects)
// DacModelMessage carries Number, Prefix, MessageType and Message only (no
// source or line): the message names the element, which the tests read.
using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.Globalization;
using System.IO;
using System.Linq;
using System.Text;
using Microsoft.SqlServer.Dac.Model;
using Microsoft.SqlServer.TransactSql.ScriptDom;

public static class TsqlCheck
{
    public static int Main(string[] args)
    {
        if (args.Length < 1)
        {
            Console.Error.WriteLine("usage: tsqlcheck.exe parse|preprocess FILE... | model Sql150|SqlAzure FILE...");
            return 2;
        }
        var stdout = new StreamWriter(Console.OpenStandardOutput(), new UTF8Encoding(false));
        stdout.AutoFlush = false;
        try
        {
            switch (args[0])
            {
                case "parse":
                    foreach (var f in args.Skip(1)) stdout.WriteLine(ParseRecord(f));
                    break;
                case "preprocess":
                    foreach (var f in args.Skip(1))
                        foreach (var rec in Preprocess(f, null)) stdout.WriteLine(rec);
                    break;
                case "model":
                    if (args.Length < 2) throw new ArgumentException("model needs a target: Sql150 or SqlAzure");
                    Model(args[1], args.Skip(2).ToList(), stdout);
                    break;
                default:
                    Console.Error.WriteLine("unknown command: " + args[0]);
                    return 2;
            }
        }
        finally
        {
            stdout.Flush();
        }
        return 0;
    }

    // ---------------------------------------------------------------- parse

    static TSqlFragment Parse(string text, out IList<ParseError> errors)
    {
        // initialQuotedIdentifiers: true, as sqlcmd -I and the rendered script's SET.
        var parser = new TSql150Parser(true);
        using (var reader = new StringReader(text))
            return parser.Parse(reader, out errors);
    }

    static string ReadText(string path)
    {
        return File.ReadAllText(path, new UTF8Encoding(false));
    }

    static string ParseRecord(string path)
    {
        IList<ParseError> errors;
        var script = Parse(ReadText(path), out errors) as TSqlScript;
        var sb = new StringBuilder();
        sb.Append("{\"kind\":\"parse\",\"source\":").Append(Json(path));
        sb.Append(",\"batches\":").Append(script == null ? 0 : script.Batches.Count);
        sb.Append(",\"errors\":[").Append(ErrorsJson(errors)).Append("]}");
        return sb.ToString();
    }

    static string ErrorsJson(IList<ParseError> errors)
    {
        return string.Join(",", errors.Select(e =>
            "{\"number\":" + e.Number + ",\"line\":" + e.Line + ",\"column\":" + e.Column +
            ",\"message\":" + Json(e.Message) + "}"));
    }

    // ----------------------------------------------------------- preprocess

    public class Kept
    {
        public string Source;
        public int Index;
        public string Type;
        public int Line;
        public string Text;      // the statement alone, OR ALTER blanked
        public string Padded;    // the file's text, blanked outside the statement
    }

    static IEnumerable<string> Preprocess(string path, List<Kept> kept)
    {
        var records = new List<string>();
        string text = ReadText(path);
        IList<ParseError> errors;
        var script = Parse(text, out errors) as TSqlScript;
        if (errors.Count > 0 || script == null)
        {
            records.Add("{\"kind\":\"parse\",\"source\":" + Json(path) + ",\"batches\":0,\"errors\":[" +
                        ErrorsJson(errors) + "]}");
            return records;
        }
        var tokens = script.ScriptTokenStream;
        int index = 0;
        foreach (var batch in script.Batches)
            foreach (var stmt in batch.Statements)
                Walk(stmt, path, text, tokens, records, kept, ref index);
        return records;
    }

    static void Skip(TSqlStatement stmt, string path, string why, List<string> records)
    {
        records.Add("{\"kind\":\"skipped\",\"source\":" + Json(path) + ",\"type\":" + Json(stmt.GetType().Name) +
                    ",\"line\":" + stmt.StartLine + ",\"why\":" + Json(why) + "}");
    }

    static bool Defines(TSqlStatement stmt)
    {
        string name = stmt.GetType().Name;
        // CreateXxxStatement, CreateOrAlterXxxStatement, AlterXxxStatement
        // (ALTER TABLE, ALTER QUEUE, ALTER ROLE ...) and GRANT define or change
        // an object; everything else is run-time work.
        return name.StartsWith("Create", StringComparison.Ordinal)
            || name.StartsWith("Alter", StringComparison.Ordinal)
            || stmt is GrantStatement;
    }

    static void Walk(TSqlStatement stmt, string path, string text, IList<TSqlParserToken> tokens,
                     List<string> records, List<Kept> kept, ref int index)
    {
        var ifs = stmt as IfStatement;
        if (ifs != null)
        {
            Walk(ifs.ThenStatement, path, text, tokens, records, kept, ref index);
            if (ifs.ElseStatement != null)
                Skip(ifs.ElseStatement, path, "ELSE branch of an IF guard (adopts an existing object)", records);
            return;
        }
        var block = stmt as BeginEndBlockStatement;
        if (block != null)
        {
            foreach (var inner in block.StatementList.Statements)
                Walk(inner, path, text, tokens, records, kept, ref index);
            return;
        }
        if (!Defines(stmt))
        {
            Skip(stmt, path, "defines no object", records);
            return;
        }
        index++;
        var padded = new StringBuilder(text.Length);
        for (int i = 0; i < text.Length; i++)
        {
            char c = text[i];
            padded.Append(c == '\n' || c == '\r' ? c : ' ');
        }
        bool afterCreate = false, orSeen = false;
        for (int t = stmt.FirstTokenIndex; t <= stmt.LastTokenIndex; t++)
        {
            var tok = tokens[t];
            string tokText = tok.Text;
            // CREATE OR ALTER -> CREATE: blank the first OR ALTER after the leading CREATE.
            if (t == stmt.FirstTokenIndex && tok.TokenType == TSqlTokenType.Create) afterCreate = true;
            else if (afterCreate && tok.TokenType == TSqlTokenType.Or && !orSeen) { orSeen = true; tokText = Blank(tokText); }
            else if (afterCreate && orSeen && tok.TokenType == TSqlTokenType.Alter) { afterCreate = false; tokText = Blank(tokText); }
            else if (afterCreate && !IsTrivia(tok)) afterCreate = false;
            for (int k = 0; k < tokText.Length; k++) padded[tok.Offset + k] = tokText[k];
        }
        string padText = padded.ToString();
        string stmtText = padText.Substring(stmt.StartOffset, stmt.FragmentLength);
        if (kept != null)
            kept.Add(new Kept { Source = path, Index = index, Type = stmt.GetType().Name, Line = stmt.StartLine,
                                Text = stmtText, Padded = padText });
        records.Add("{\"kind\":\"statement\",\"source\":" + Json(path) + ",\"index\":" + index +
                    ",\"type\":" + Json(stmt.GetType().Name) + ",\"line\":" + stmt.StartLine +
                    ",\"text\":" + Json(stmtText) + "}");
    }

    static bool IsTrivia(TSqlParserToken tok)
    {
        return tok.TokenType == TSqlTokenType.WhiteSpace || tok.TokenType == TSqlTokenType.SingleLineComment
            || tok.TokenType == TSqlTokenType.MultilineComment;
    }

    static string Blank(string s)
    {
        return new string(' ', s.Length);
    }

    // ---------------------------------------------------------------- model

    static void Model(string target, List<string> files, StreamWriter stdout)
    {
        var watch = Stopwatch.StartNew();
        SqlServerVersion version;
        if (target == "Sql150") version = SqlServerVersion.Sql150;
        else if (target == "SqlAzure") version = SqlServerVersion.SqlAzure;
        else throw new ArgumentException("unknown model target: " + target);
        var kept = new List<Kept>();
        foreach (var f in files)
            foreach (var rec in Preprocess(f, kept)) stdout.WriteLine(rec);
        int objects;
        using (var model = new TSqlModel(version, new TSqlModelOptions()))
        {
            foreach (var k in kept)
                model.AddOrUpdateObjects(k.Padded, k.Source + "#" + k.Index, new TSqlObjectOptions());
            foreach (var msg in model.Validate())
            {
                stdout.WriteLine("{\"kind\":\"model\",\"target\":" + Json(target) + ",\"number\":" + msg.Number +
                                 ",\"prefix\":" + Json(msg.Prefix) + ",\"severity\":" + Json(msg.MessageType.ToString()) +
                                 ",\"message\":" + Json(msg.Message) + "}");
            }
            objects = model.GetObjects(DacQueryScopes.UserDefined).Count();
        }
        stdout.WriteLine("{\"kind\":\"summary\",\"target\":" + Json(target) + ",\"files\":" + files.Count +
                         ",\"statements\":" + kept.Count + ",\"objects\":" + objects + ",\"seconds\":" +
                         watch.Elapsed.TotalSeconds.ToString("0.000", CultureInfo.InvariantCulture) + "}");
    }

    // ----------------------------------------------------------------- JSON

    static string Json(string s)
    {
        if (s == null) return "null";
        var sb = new StringBuilder("\"");
        foreach (char c in s)
        {
            switch (c)
            {
                case '"': sb.Append("\\\""); break;
                case '\\': sb.Append("\\\\"); break;
                case '\n': sb.Append("\\n"); break;
                case '\r': sb.Append("\\r"); break;
                case '\t': sb.Append("\\t"); break;
                default:
                    if (c < 0x20) sb.Append("\\u").Append(((int)c).ToString("x4"));
                    else sb.Append(c);
                    break;
            }
        }
        return sb.Append('"').ToString();
    }
}
