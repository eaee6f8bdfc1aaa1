import KeyholdAuth
import KeyholdCore
import KeyholdProtocol

/// The release gate's conversation over a caller's socket: notices and prompts as frames, an
/// answer read within the prompt deadline, and the socket itself as the interrupt (it becomes
/// readable when the caller cancels or goes away). Without `mayPrompt` (a request the table
/// says never prompts) it announces nothing and asks nothing: the gate then refuses.
struct SocketConversation: Conversation {
    let fd: Int32
    let mayPrompt: Bool

    var interruptFD: Int32? { fd }

    func announce(_ announcement: Announcement) -> Bool {
        mayPrompt && send(.notice(Notice(announcing: announcement)))
    }

    func notify(_ style: Notice.Style, _ text: String) -> Bool {
        send(.notice(Notice(style: style, text: text)))
    }

    func ask(_ prompt: Prompt) -> PAMAnswer {
        guard mayPrompt, send(.prompt(prompt)) else { return .cancel }
        do throws(FrameError) {
            var reader = TimedFrameReader(fd: fd)
            let ms = Session.Deadlines.answerMilliseconds
            guard let payload = try reader.read(idleMilliseconds: ms, frameMilliseconds: ms) else { return .cancel }
            defer { payload.wipe() }
            if case .answer(let s) = try ClientMessage.decode(payload) { return .answer(s) }
            return .cancel
        } catch {
            return .cancel
        }
    }

    private func send(_ message: BrokerMessage) -> Bool {
        do throws(FrameError) {
            try Frame.write(message.encode(), to: fd)
            return true
        } catch {
            return false
        }
    }
}
